"""Prometheus metrics: counters and histograms per process, backlog gauges from the database at scrape time,
the metrics/ view's access rules, and weft_maintenance --metrics-port."""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

import django_weft as weft
from django_weft.common import clock
from django_weft.models import Workflow
from django_weft.observability import events
from tests.procs import wait_until

URL = "/weft/metrics/"
pytestmark = pytest.mark.django_db(transaction=True)  # run metrics are counted after commit


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scrape: dict, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(client) -> dict:
    with override_settings(WEFT_METRICS_PUBLIC=True):
        response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


@pytest.fixture
def metrics_off():
    with override_settings(WEFT_METRICS=False):
        events.configure()
        yield
    events.configure()


def test_runs_are_counted_by_type_and_status_and_their_steps_and_attempts_timed(client, weft_env):
    before = scrape(client)
    for key in ("m1", "m2"):
        weft.start("test.steps", {"key": key, "count": 2})
    weft.start("test.uncaught", "m3")  # its activity raises ValueError, which is not retried
    weft_env.drive()
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("weft_runs_started_total", workflow_type="test.steps") == 2
    assert delta("weft_runs_started_total", workflow_type="test.uncaught") == 1
    assert delta("weft_runs_finished_total", workflow_type="test.steps", status="completed") == 2
    assert delta("weft_runs_finished_total", workflow_type="test.uncaught", status="failed") == 1
    assert delta("weft_runs_finished_total", workflow_type="test.steps", status="failed") == 0
    assert delta("weft_step_duration_seconds_count", kind="activity") == 5  # 4 completed, 1 failed
    assert delta("weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.record",
                 outcome="completed") == 4
    assert delta("weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.refuses",
                 outcome="failed") == 1
    assert delta("weft_run_execution_duration_seconds_count", workflow_type="test.steps", outcome="completed") == 2
    assert value(after, "weft_executor_threads_busy") == 0
    assert value(after, "weft_runnable_runs") == 0


def test_a_retried_attempt_is_timed_as_failed_then_completed(client, weft_env):
    before = scrape(client)
    weft.start("test.retry", {"key": "mr", "failures": 1})
    weft_env.drive()
    weft_env.advance(timedelta(seconds=2))
    after = scrape(client)
    name, activity = "weft_activity_attempt_duration_seconds_count", "tests.testapp.workflows.flaky"
    for outcome in ("failed", "completed"):
        assert value(after, name, activity=activity, outcome=outcome) - value(
            before, name, activity=activity, outcome=outcome) == 1


def test_steps_recorded_in_a_rolled_back_transaction_are_not_counted(client, weft_env):
    before = scrape(client)
    weft.start("test.steps", {"key": "rb", "count": 1})
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.run_maintenance()  # executes the run; its step is rolled back with the rest
        raise RuntimeError("rolled back")
    weft_env.drive()  # executes it again: the step is recorded once
    after = scrape(client)
    name = "weft_step_duration_seconds_count"
    assert value(after, name, kind="activity") - value(before, name, kind="activity") == 1


def test_backlog_gauges_come_from_the_database_at_scrape_time(client, weft_env):
    weft.start("test.steps", {"key": "b1", "count": 1})
    weft.start("test.steps", {"key": "b2", "count": 1})
    weft.start("test.steps", {"key": "b3", "count": 1}, start_after=3600)  # not due: not in the backlog
    first = scrape(client)
    assert value(first, "weft_runnable_runs") == 2
    assert value(first, "weft_runnable_oldest_age_seconds") >= 0
    assert value(first, "weft_timers_overdue") == 0
    clock.set_frozen(weft_env.now() + timedelta(seconds=30))
    later = scrape(client)
    assert value(later, "weft_runnable_oldest_age_seconds") == pytest.approx(30)
    clock.set_frozen(weft_env.now() + timedelta(seconds=3600 + 30))  # the delayed start's timer is overdue
    late = scrape(client)
    assert value(late, "weft_runnable_runs") == 3 and value(late, "weft_timers_overdue") == 1
    weft_env.drive()
    assert value(scrape(client), "weft_runnable_runs") == 0


def test_a_run_whose_executor_died_is_in_the_backlog_and_counted_as_a_takeover(client, weft_env):
    handle = weft.start("test.approval", "died")
    weft_env.drive()  # parked, waiting for a signal
    before = scrape(client)
    # As a killed executor leaves it: running, held by a dead owner, lease expired a second ago.
    Workflow.objects.filter(pk=handle.run_id).update(status="running", lease_owner="dead-worker",
                                                     runnable_at=weft_env.now() - timedelta(seconds=1))
    held = scrape(client)
    assert value(held, "weft_runnable_runs") == 1
    assert value(held, "weft_runnable_oldest_age_seconds") == pytest.approx(1)
    weft_env.drive()
    after = scrape(client)
    name = "weft_lease_takeovers_total"
    assert value(after, name, workflow_type="test.approval") - value(before, name, workflow_type="test.approval") == 1
    assert value(after, "weft_runnable_runs") == 0


def test_schedule_lag_is_how_late_the_most_overdue_schedule_is(client, weft_env):
    weft.create_schedule("lag", "test.collect", 0, every=timedelta(minutes=1))
    assert value(scrape(client), "weft_schedule_lag_seconds") == 0
    clock.set_frozen(weft_env.now() + timedelta(minutes=1, seconds=45))
    assert value(scrape(client), "weft_schedule_lag_seconds") == pytest.approx(45, abs=1)


# --- who may read them --------------------------------------------------------------------------------


def test_the_view_needs_a_staff_user_or_the_token_unless_public(client):
    assert client.get(URL).status_code == 401
    assert client.get(URL)["WWW-Authenticate"].startswith("Bearer")
    User.objects.create_user("member", password="pw")
    User.objects.create_user("staff", password="pw", is_staff=True)
    client.login(username="member", password="pw")
    assert client.get(URL).status_code == 403
    client.login(username="staff", password="pw")
    assert client.get(URL).status_code == 200
    client.logout()
    with override_settings(WEFT_METRICS_TOKEN="s3cret"):
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
        assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        assert client.get(URL).status_code == 401
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer s3cret").status_code == 401  # no token configured
    with override_settings(WEFT_METRICS_PUBLIC=True):
        assert client.get(URL).status_code == 200
        assert client.post(URL).status_code == 405


def test_the_view_takes_the_bearer_scheme_in_any_case(client):
    with override_settings(WEFT_METRICS_TOKEN="s3cret"):  # RFC 7235: auth schemes are case-insensitive
        for scheme in ("bearer", "BEARER", "bEaReR"):
            assert client.get(URL, HTTP_AUTHORIZATION=f"{scheme} s3cret").status_code == 200, scheme
            assert client.get(URL, HTTP_AUTHORIZATION=f"{scheme} wrong").status_code == 403, scheme
        assert client.get(URL, HTTP_AUTHORIZATION="Basic s3cret").status_code == 401
        assert client.get(URL, HTTP_AUTHORIZATION="Bearers3cret").status_code == 401


def test_with_metrics_off_the_view_answers_501_and_the_port_is_refused(client, metrics_off):
    with override_settings(WEFT_METRICS_PUBLIC=True):
        response = client.get(URL)
    assert response.status_code == 501 and b"prometheus-client" in response.content
    with pytest.raises(CommandError, match="--metrics-port needs prometheus-client"):
        call_command("weft_maintenance", "--metrics-port", "0")


# --- weft_maintenance --metrics-port ------------------------------------------------------------------


def test_weft_maintenance_serves_its_own_counters_and_the_database_gauges(maintenance):
    proc = maintenance("metrics", "--metrics-port", "0", "--interval", "0.2")
    port = re.compile(r"metrics at http://[^:]*:(\d+)/metrics")
    wait_until(lambda: port.search(proc.stdout()), "the metrics port in the output", 30, procs=[proc])
    url = f"http://127.0.0.1:{port.search(proc.stdout()).group(1)}/metrics"
    handle = weft.start("test.steps", {"key": "p1", "count": 2})
    weft.start("test.steps", {"key": "p2", "count": 1}, start_after=3600)
    wait_until(lambda: handle.status == "completed", "the run to complete", 30, procs=[proc])

    def read() -> dict:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            return samples(response.read().decode())

    finished = {"workflow_type": "test.steps", "status": "completed"}
    wait_until(lambda: value(read(), "weft_runs_finished_total", **finished) == 1,
               "the finished run in the served metrics", 30, procs=[proc])
    served = read()
    assert value(served, "weft_runs_started_total", workflow_type="test.steps") == 0  # started by this process
    assert value(served, "weft_step_duration_seconds_count", kind="activity") == 2
    assert value(served, "weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.record",
                 outcome="completed") == 2
    assert value(served, "weft_runnable_runs") == 0  # the delayed one is not due
    assert value(served, "weft_timers_overdue") == 0
    assert proc.alive


def test_the_metrics_port_asks_for_the_token_when_one_is_set(settings):
    from django_weft.observability import metrics

    server = metrics.serve(0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        settings.WEFT_METRICS_TOKEN = "s3cret"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            assert refused.value.code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):  # RFC 7235: the scheme in any case
            request = urllib.request.Request(url, headers={"Authorization": f"{scheme} s3cret"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200 and b"weft_runnable_runs" in response.read()
        settings.WEFT_METRICS_TOKEN = None
        with urllib.request.urlopen(url, timeout=10) as response:  # no token set: open, as exporters are
            assert response.status == 200
    finally:
        server.shutdown()


def test_a_start_rolled_back_is_not_counted_and_a_run_in_the_caller_is_counted_once(client):
    before = scrape(client)
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start("test.steps", {"key": "rolled-back", "count": 1})
        raise RuntimeError("the caller's transaction rolls back")
    handle = weft.run("test.steps", {"key": "in-caller-counted", "count": 3})  # each step its own statement
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert handle.status == "completed"
    assert delta("weft_runs_started_total", workflow_type="test.steps") == 1
    assert delta("weft_runs_finished_total", workflow_type="test.steps", status="completed") == 1
    assert delta("weft_step_duration_seconds_count", kind="activity") == 3
    assert delta("weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.record",
                 outcome="completed") == 3


def test_an_attempt_that_hands_out_its_token_is_timed_as_async(client, weft_env):
    before = scrape(client)
    weft.start("test.async", "metrics-async")
    weft_env.drive()
    after = scrape(client)
    assert value(after, "weft_activity_attempt_duration_seconds_count", activity="tests.testapp.workflows.ask_human",
                 outcome="async") - value(before, "weft_activity_attempt_duration_seconds_count",
                                          activity="tests.testapp.workflows.ask_human", outcome="async") == 1


def this_hosts_address() -> str | None:
    """An address of this host other than loopback (connecting a UDP socket sends nothing), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.fixture
def outside_address() -> str:
    address = this_hosts_address()
    if address is None:
        pytest.skip("needs a network interface other than loopback")
    return address


def test_the_metrics_port_listens_on_this_host_only_unless_told(maintenance, outside_address):
    served = re.compile(r"metrics at http://([^:]*):(\d+)/metrics")
    local = maintenance("local", "--no-execute", "--metrics-port", "0")
    wait_until(lambda: served.search(local.stdout()), "the metrics address in the output", 30, procs=[local])
    host, port = served.search(local.stdout()).groups()
    assert host == "127.0.0.1"
    assert answers("127.0.0.1", int(port))
    assert not answers(outside_address, int(port)), "the metrics port answers from outside this host"
    assert "WEFT_METRICS_TOKEN" not in local.stderr()

    everywhere = maintenance("everywhere", "--no-execute", "--metrics-port", "0", "--metrics-addr", "0.0.0.0")
    wait_until(lambda: served.search(everywhere.stdout()), "the metrics address in the output", 30,
               procs=[everywhere])
    assert answers(outside_address, int(served.search(everywhere.stdout()).group(2)))
    # Open to the network without a token: said at start.
    wait_until(lambda: "set WEFT_METRICS_TOKEN" in everywhere.stderr(), "the warning about an open port", 30,
               procs=[everywhere])


def test_the_metrics_server_listens_on_loopback_by_default():
    from django_weft.observability import metrics

    server = metrics.serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()


def test_a_client_that_connects_and_sends_nothing_does_not_hold_up_scrapes():
    from django_weft.observability import metrics

    server = metrics.serve(0)
    silent = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
    try:
        # A one-request-at-a-time server would wait for the silent client's request line forever.
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            assert response.status == 200 and b"weft_runnable_runs" in response.read()
    finally:
        silent.close()
        server.shutdown()
