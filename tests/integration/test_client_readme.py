"""README.md's *Python client* examples, run as written against a real `hft-infer serve`.

The code blocks are taken from the README (so the README cannot drift from
the client), each runs in its own Python process with the service's runtime
dir in the environment, exactly as a user would run them beside `hft-infer
serve` with the default config: the two subscribers first (each says
"connected:" once its subscription is live), then the publisher; then the
service is stopped, and both subscribers must end on its final Status.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from service_harness import TEST_MODEL, ServiceUnderTest

ROOT = Path(__file__).resolve().parents[2]
SAFETY_S = 120.0  # bound on waiting for subprocesses on a shared 2-core box; not a measurement


def readme_examples() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Python client\n"):readme.index("## Wire schema\n")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    out = {}
    for code in blocks:
        kind = ("publisher" if "FeedPublisher" in code else "asyncio" if "async def" in code else "subscriber")
        assert kind not in out, f"two {kind} examples"
        out[kind] = code
    assert set(out) == {"publisher", "subscriber", "asyncio"}, sorted(out)
    return out


def test_the_readme_examples_have_the_promised_size():
    for kind, code in readme_examples().items():
        assert len(code.strip().splitlines()) <= 20, kind


class Example:
    def __init__(self, code: str, env: dict, log: Path) -> None:
        self.log = log
        self.out = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=self.out, stderr=subprocess.STDOUT,
                                     env=env, text=True)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, marker: str) -> None:
        deadline = time.monotonic() + SAFETY_S
        while marker not in self.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    def finish(self) -> str:
        try:
            rc = self.proc.wait(SAFETY_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.out.close()
        assert rc == 0, self.text()
        return self.text()


def test_the_readme_examples_run_against_a_service(tmp_path):
    examples = readme_examples()
    # the default config's service name, so that for_service() with no arguments finds it
    with ServiceUnderTest(TEST_MODEL, name="hft-infer") as svc:
        svc.service.start()
        env = dict(os.environ, HFT_INFER_RUNTIME_DIR=svc.runtime, PYTHONUNBUFFERED="1")
        subscriber = Example(examples["subscriber"], env, tmp_path / "subscriber.log")
        asyncio_sub = Example(examples["asyncio"], env, tmp_path / "asyncio.log")
        try:
            subscriber.wait_for("connected:")
            asyncio_sub.wait_for("connected:")
            publisher = Example(examples["publisher"], env, tmp_path / "publisher.log")
            publisher.finish()
            # the last quote of instrument 7 (seq 25, from publish_quotes) is answered before we stop
            subscriber.wait_for("7 seq 25:")
            svc.proc.send_signal(signal.SIGTERM)
            assert svc.proc.wait(SAFETY_S) == 0, svc.log_tail()
            out, aout = subscriber.finish(), asyncio_sub.finish()
        finally:
            for ex in (subscriber, asyncio_sub):
                if ex.proc.poll() is None:
                    ex.proc.kill()
        summary = svc.summary()
    lines = out.splitlines()
    assert lines[0].startswith("connected: eager mlp_small@")
    answered = [ln for ln in lines if re.match(r"\d+ seq \d+: ", ln)]
    assert {int(ln.split()[0]) for ln in answered} == set(range(8)), out  # every instrument answered
    assert all(re.search(r": action [+-]\d, score [+-]\d\.\d{3}$|: SHED STALE$", ln) for ln in answered), out
    assert lines[-1] == f"service stopped: cleanly after {summary['accounting']['decided']} decisions", out
    alines = aout.splitlines()
    assert alines[0] == "connected: eager" and len(alines) > 1, aout
    assert all(re.fullmatch(r"3 seq \d+: action [+-]\d", ln) for ln in alines[1:]), aout
    counters = summary["counters"]
    assert summary["accounting"]["received"] == 200 + 1 + 8  # quotes, the trade, the batch
    assert counters["resets"] == 1 and counters["heartbeats"] == 1
