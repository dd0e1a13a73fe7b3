-- cancel: ARGV after the owner: token, mode. mode 'cancel' (hang-up, drain, forget):
-- leave the queue, or give back the slots granted in the same instant. mode 'timeout'
-- (the local queue deadline): leave the queue, but keep slots granted just before the
-- deadline (the reply names their replica). A head that leaves may let the next ones in:
-- promote again.

local token = ARGV[7]
local n = maintain()
local code, addr = 0, ''
if redis.call('HGET', W, token) == owner then
  drop_waiter(token)
  code = 1
  promote()
elseif redis.call('HGET', S, token) == owner then
  code = 2
  local _
  _, addr = bound_of(token)
  if ARGV[8] == 'cancel' then
    free(token)
    code, addr = 3, ''
    promote()
  end
end
return reply(code, 0, n, addr)
