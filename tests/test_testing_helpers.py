"""django_weft.testing: the fake clock and synchronous driver users test their workflows with."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.common import clock
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db


def test_env_freezes_and_restores_the_clock():
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    with WeftTestEnv(start=start) as env:
        assert env.now() == start
        env.advance(timedelta(days=2))
        assert clock.now() == start + timedelta(days=2)
    assert clock.now() != start + timedelta(days=2)


def test_a_two_day_sleep_is_tested_in_no_time():
    with WeftTestEnv() as env:
        handle = weft.start("test.long_sleep")
        env.drive()
        assert handle.status == "waiting"
        report = env.advance(timedelta(days=2))
        assert report.woken == 1
        assert handle.result() == "woke"


def test_env_rejects_bad_use():
    with pytest.raises(ValueError, match="aware"):
        WeftTestEnv(start=dt.datetime(2030, 1, 1))
    with WeftTestEnv() as env, pytest.raises(ValueError, match="forward"):
        env.advance(-1)


def test_the_pytest_fixture_is_available(weft_env):
    assert isinstance(weft_env, WeftTestEnv)
    assert clock.now() == weft_env.start_time
