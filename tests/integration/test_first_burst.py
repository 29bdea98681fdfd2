"""A service's first bursts import nothing: a module imported lazily on the hot path stalls the loop
at every feed's start (numpy 2.4's np.unique imported numpy.ma on its first call, 7-11 ms on the
dev VM inside the scheduler's column push, in the first EventBatch burst of a sequential model:
a LATE spell in every shard of BENCHMARKS.md wave 29).

Each case runs in a fresh interpreter (this process has imported whatever other tests needed): a
real Service on ipc sockets, warmed up as serve does; then an import hook is installed and the
service ingests, steps, answers and publishes EventBatch frames and single quotes. The hook's list
of modules imported meanwhile must be empty."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os, sys, tempfile, time
    import numpy as np
    import zmq
    from hft_infer.config import load_config
    from hft_infer.service import Service
    from hft_infer.transport.codec import encode, event_batch, pack_book, topic_for, BATCH_TOPIC
    from hft_infer.transport.schema import Quote

    overrides = json.loads(sys.argv[1])
    runtime = tempfile.mkdtemp(prefix="hft-fb-", dir="/tmp")
    os.environ["HFT_INFER_RUNTIME_DIR"] = runtime
    n_inst = 64
    # a deadline of 10 s: on a slow or stalled machine nothing goes stale, every event is decided
    cfg = load_config(None, ['model.checkpoint=""', "control.enabled=false", f"universe.instruments={n_inst}",
                             "scheduler.max_age_us=10000000", *overrides])
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(f"ipc://{runtime}/hft-infer-md.sock")
    svc = Service(cfg)
    svc.open_sockets(ctx)
    svc.warm_up()
    subs = 0
    while subs < n_inst + 1 and pub.poll(5000):
        subs += pub.recv()[:1] == b"\\x01"

    rng = np.random.default_rng(0)
    books = (rng.random((256, 10, 4)) * 10 + 100).astype(np.float32)
    frames = []
    for k in range(8):  # EventBatch frames of 32: four events an instrument in the burst, queues of several
        j = np.arange(32 * k, 32 * (k + 1))
        prio = (j % 4).astype(np.int8)  # every priority class: the column push splits by class
        frames.append((BATCH_TOPIC, encode(event_batch(j % n_inst, j // n_inst, np.zeros(32),
                                                       np.zeros(32, np.int64), books[j % 256], priority=prio))))
    frames += [(topic_for(i), encode(Quote(i, 4, 0, 0, 10, pack_book(books[i]), -1))) for i in range(8)]

    imported = []

    class Recorder:
        def find_spec(self, name, path=None, target=None):
            imported.append(name)
            return None  # only watch: the normal finders load it

    sys.meta_path.insert(0, Recorder())
    for topic, payload in frames:
        pub.send_multipart([topic, payload])
    deadline = time.monotonic() + 10
    # until every event is in and answered (ingest counts frames; the accounting counts events)
    while (svc.acct.received < 256 + 8 or svc.sched.queued_slots or svc.step.inflight) and time.monotonic() < deadline:
        svc.step.ingest()
        svc.step.submit(force=True)
        svc.step.drain_inflight()
        svc.step.flush()
    print(json.dumps({"imported": imported, "received": svc.acct.received, "decided": svc.acct.decided}))
''')


def run_first_bursts(overrides: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(overrides)], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("overrides, every_event_decided", [
    (['model.preset="lstm_a"', 'model.mode="stream"'], True),  # sequential: the column push (push_columns)
    (['model.preset="mlp_small"'], False),  # conflating: the newest event of an instrument's burst
], ids=["sequential", "conflating"])
def test_the_first_bursts_import_nothing(overrides, every_event_decided):
    out = run_first_bursts(overrides)
    assert out["received"] == 256 + 8, out  # the bursts were really ingested, stepped and answered
    assert out["decided"] == 256 + 8 if every_event_decided else out["decided"] > 0, out
    assert out["imported"] == [], f"modules imported on the hot path after warm-up: {out['imported']}"
