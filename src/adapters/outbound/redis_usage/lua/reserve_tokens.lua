-- reserve_tokens: ARGV[5]: tokens (the estimate, >= 0), reserved in every token limit or in
-- none. Reply as take_request's.

local tokens = tonumber(ARGV[5])
if (tk and tk < math.min(tokens, tpm) * S) or (tpd and used + math.min(tokens, tpd) > tpd) then
  return reply(0)
end
if tk then tk = tk - tokens * S end
if tpd then used = used + tokens end
store()
return reply(1)
