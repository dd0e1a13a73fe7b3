"""Reading vLLM 0.32's `/metrics` page (`tests/fixtures/vllm-0.32-metrics.txt`, about 55 KB of
histograms, engine-labelled gauges and `vllm:num_requests_waiting_by_reason`): what the load
reader takes from it, and what that costs the event loop."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support.vllm_page import Engine, fixture, vllm_page

from adapters.outbound.vllm_load import MAX_BODY, ScrapeError, VllmGauges, parse_load, read_timeout
from domain.load_reports import LoadReport, saturated


def report(page: str) -> LoadReport:
    gauges = parse_load(page)
    return LoadReport(running=gauges.running, waiting=gauges.waiting, deferred=gauges.deferred, at=0.0)


def test_the_fixture_is_the_size_of_vllm_0_32s_page() -> None:
    assert 50_000 < len(fixture().encode()) < 60_000 < MAX_BODY


def test_the_page_gives_running_waiting_and_the_deferred_part_of_waiting() -> None:
    assert parse_load(fixture()) == VllmGauges(running=2, waiting=3, deferred=1)
    assert report(fixture()).queued == 2  # the "capacity" ones


def test_only_requests_waiting_for_capacity_make_a_replica_saturated() -> None:
    deferred = report(vllm_page(Engine(running=1, deferred=4)))
    assert (deferred.waiting, deferred.deferred, deferred.queued) == (4, 4, 0)
    assert not saturated(deferred, 0.0, 1.0, 4)  # waiting for a grammar or an adapter, not for room
    capacity = report(vllm_page(Engine(running=1, capacity=1, deferred=4)))
    assert capacity.queued == 1 and saturated(capacity, 0.0, 1.0, 4)


def test_every_engine_of_a_replica_is_summed() -> None:
    """Data parallelism: one vLLM server, engine cores "0" and "1", each with its own gauges."""
    page = vllm_page(Engine(running=3, capacity=0, deferred=1), Engine(running=4, capacity=2, deferred=0))
    assert 'engine="1"' in page
    assert parse_load(page) == VllmGauges(running=7, waiting=3, deferred=1)


def test_a_vllm_without_the_split_has_all_its_waiting_for_room() -> None:
    page = vllm_page(Engine(running=1, capacity=2), old_vllm=True)
    assert "by_reason" not in page
    assert parse_load(page) == VllmGauges(running=1, waiting=2, deferred=0)
    assert report(page).queued == 2


def test_a_page_split_by_reason_without_the_total_gives_their_sum() -> None:
    page = ('vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0\n')  # fmt: skip
    assert parse_load(page) == VllmGauges(running=1, waiting=3, deferred=1)


def test_model_names_are_summed_and_other_families_ignored() -> None:
    page = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 2.0\n'
        'vllm:num_requests_running{engine="0",model_name="b"} 1.0\n'
        "# TYPE vllm:num_requests_running_total_fake counter\nvllm:num_requests_running_total_fake 9.0\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="a"} 0.99\n'
        'vllm:num_requests_waiting{model_name="a"} 0.0\nvllm:num_requests_waiting{model_name="b"} 4.0\n'
    )
    assert parse_load(page) == VllmGauges(running=3, waiting=4, deferred=0)


@pytest.mark.parametrize("page", [
    "# nothing from vLLM here\nprocess_cpu_seconds_total 1.0\n",
    'vllm:num_requests_running{model_name="a" 2\n',
    'vllm:num_requests_running{model_name="a"} NaN\n',
])  # fmt: skip
def test_a_page_without_usable_gauges_is_a_scrape_error(page: str) -> None:
    with pytest.raises(ScrapeError):
        parse_load(page)


def test_a_read_is_bounded_by_the_interval_and_never_more_than_two_seconds() -> None:
    assert read_timeout(0.2) == 0.2 and read_timeout(1.0) == 1.0 and read_timeout(5.0) == 2.0


def test_reading_the_page_costs_a_fraction_of_parsing_all_of_it() -> None:
    """Every replica's page every second: the families read are picked out before the parser
    runs (measured here: 0.2 ms against 8 ms for the whole page)."""
    page = fixture()

    def per_call(run: object, times: int) -> float:
        assert callable(run)
        run()
        started = time.perf_counter()
        for _ in range(times):
            run()
        return (time.perf_counter() - started) / times

    whole = per_call(lambda: [s for f in text_string_to_metric_families(page) for s in f.samples], 10)
    picked = per_call(lambda: parse_load(page), 50)
    assert picked * 10 < whole and picked < 0.005
