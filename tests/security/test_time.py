"""Setting the host clock from inside."""

from __future__ import annotations

import time

import pytest

import secutil
from secutil import attack, run_script

CLOCK_SLACK_S = 0.5


@pytest.fixture(scope="module")
def clock_attack(sclient, target):
    before = secutil.clock_offset()
    try:
        out = run_script(sclient, target["id"], "clock")[1]
    finally:
        after = secutil.clock_offset()
        if abs(after - before) > CLOCK_SLACK_S:  # undo a successful attack on this host
            time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_MONOTONIC) + before)
    return out, before, after


@pytest.mark.parametrize("key", ["clock_settime", "settimeofday", "adjtimex_set", "clock_adjtime_setoffset"])
@attack("time", "clock_settime(CLOCK_REALTIME), settimeofday, adjtimex and clock_adjtime in set mode")
def test_set_clock(clock_attack, key):
    out, before, after = clock_attack
    assert out[key] == "EPERM", f"{key}: expected EPERM, got {out[key]}"
    assert abs(after - before) < CLOCK_SLACK_S, f"host CLOCK_REALTIME moved by {after - before:.3f}s"


@attack("time", "date -s '2001-09-09 01:46:40'")
def test_date_s(clock_attack):
    out, before, after = clock_attack
    assert out["date_s_exit"] == 1, f"date -s exited {out['date_s_exit']}"
    assert abs(after - before) < CLOCK_SLACK_S, f"host CLOCK_REALTIME moved by {after - before:.3f}s"
