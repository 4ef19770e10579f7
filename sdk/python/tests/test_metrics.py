"""Per-sandbox metrics and auto-pause through the SDK (the daemon samples every 500 ms here)."""

from __future__ import annotations

import time

from airlock import Sandbox


def _wait_for(predicate, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def test_metrics_move_with_cpu_and_disk_and_stay_after_delete(daemon) -> None:
    sbx = Sandbox.create(url=daemon.url, api_key=daemon.api_key)
    try:
        assert sbx.exec("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; "
                        "head -c 3000000 /dev/urandom > /home/user/blob; echo ok").stdout == "ok\n"
        sample = _wait_for(lambda: next((m for m in sbx.metrics()
                                         if m["cpu_seconds"] > 0.1
                                         and m["disk_bytes"] >= 3000000), None))
        assert sample is not None, sbx.metrics()
        for key in ("at_ms", "cpu_cores", "memory_bytes", "memory_peak_bytes", "pids",
                    "net_rx_bytes", "net_tx_bytes"):
            assert key in sample
        assert sample["memory_bytes"] > 0
        newest = sbx.metrics(limit=1)
        assert len(newest) == 1
        assert sbx.metrics(start=0, end=1) == []
    finally:
        sbx.kill()
    assert len(sbx.metrics()) >= 1, "kept after the delete"


def test_auto_pause_pauses_when_idle_and_an_exec_resumes_it(daemon) -> None:
    sbx = Sandbox.create(auto_pause={"idle_seconds": 1}, url=daemon.url, api_key=daemon.api_key)
    try:
        assert sbx.info["auto_pause"] == {"idle_seconds": 1, "memory": False}
        assert _wait_for(lambda: sbx.refresh().state == "paused"), sbx.state
        assert sbx.info.get("auto_paused") is True
        assert sbx.exec("echo awake").stdout == "awake\n"
        assert sbx.refresh().state == "running"
        assert "auto_paused" not in sbx.info
    finally:
        sbx.kill()
