#!/usr/bin/env python3
"""Crash soak of awp-node, driven through the `awp` CLI as a user would (see scripts/soak.sh).

Message mode (default): two nodes, a and b, in temporary homes on 127.0.0.1 over TLS. Worker
threads on both sides run `awp send` back to back, each in its own AWP thread, with the
message's identity in its text: `s<sender>-t<worker>-n<counter>`. A driver SIGKILLs a random
node at random moments (and, on some cycles, a random in-flight `awp send`), then restarts it
on the same port. At the end the workers stop, both outboxes must drain, and each node's
message log is checked against what the other side's sends reported:

  queued     `awp send` exited 0 (the node reported the line durable in its outbox)
  uncertain  `awp send` was SIGKILLed, failed (the node died under it) or timed out
  LOST       queued, never arrived
  DUP        a text that arrived more than once (queued or uncertain)
  REORDER    within one worker, two queued messages arrived in the opposite order of the
             completion of their sends (uncertain ones have no completion to order by)
  UNKNOWN    a text that arrived but was never sent (a corrupted or invented line)

Store mode (--store): a writer (examples/store_crash.rs) does heavy concurrent writes to one
store, printing each record after its flush returned; it is SIGKILLed at a random moment,
and the store is reopened and checked: it must open and hold every printed record.

Exits 1 on any loss, dup, reorder, unknown text, restart failure, failed drain or failed
store check; 2 on bad usage. Standard library only.
"""

import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

TEXT_RE = re.compile(r"^s([ab])-t(\d+)-n(\d+)$")
SEND_TIMEOUT_S = 60  # one `awp send`; beyond that it counts as hung (and uncertain)
UP_TIMEOUT_S = 40  # one `awp up` (the node itself waits up to 15 s for its start)
CTL_TIMEOUT_S = 20  # status, tail, connect, down
DEATH_TIMEOUT_S = 10  # a SIGKILLed process leaving /proc


class Abort(Exception):
    """The soak cannot go on (a node does not come back, a signal arrived)."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pid_state(pid):
    """The process state letter from /proc (R, S, Z, …), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid):
    return pid_state(pid) not in (None, "Z", "X")


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def vm_hwm_kib(pid):
    """Peak resident set size of a live process (VmHWM, KiB), or 0."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pids_under(path):
    """Pids of processes whose command line names `path` (our temporary work directory)."""
    needle = os.fsencode(path)
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            if any(needle in arg for arg in cmdline(int(d))):
                out.append(int(d))
    return out


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_gone(pid, timeout=DEATH_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Node:
    """One node home, driven by the CLI."""

    def __init__(self, awp, work, name):
        self.awp = awp
        self.name = name
        self.home = os.path.join(work, name)
        self.port = 0
        self.key = None
        self.kills = 0
        self.restarts = 0
        self.hwm_kib = 0

    def cli(self, *args, timeout=CTL_TIMEOUT_S):
        return subprocess.run(
            [self.awp, "--home", self.home, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def status(self):
        """`awp status --json` as a dict, or None (no node, or no answer in time)."""
        try:
            r = self.cli("--json", "status", timeout=CTL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def up(self):
        """`awp up` on this node's port (an ephemeral one the first time). Returns None on
        success, else a one-line reason."""
        listen = f"tls:127.0.0.1:{self.port}"
        try:
            r = self.cli("up", "--listen", listen, "--name", f"{self.name}@soak", timeout=UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"`awp up` did not return within {UP_TIMEOUT_S} s"
        if r.returncode != 0:
            return f"`awp up` exited {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}"
        st = self.status()
        if st is None:
            return "`awp up` returned but `awp status` does not answer"
        addr = (st.get("addresses") or [""])[0]
        m = re.match(r"^tls:127\.0\.0\.1:(\d+)#(ed25519:\S+)$", addr)
        if not m:
            return f"unexpected address {addr!r}"
        port, key = int(m.group(1)), m.group(2)
        if self.port == 0:
            # Keep the port across restarts, also for a node a sending CLI starts by itself
            # (commands start the node when it is not running; config.toml gives its port).
            self.port = port
            fd = os.open(os.path.join(self.home, "config.toml"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f'listen = ["tls:127.0.0.1:{port}"]\n')
        elif port != self.port:
            return f"came back on port {port}, expected {self.port}"
        self.key = key
        return None

    def pid(self):
        """The pid of the node holding this home's lock, when it is alive and is ours."""
        try:
            with open(os.path.join(self.home, "node.lock")) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return None
        if pid <= 0 or not alive(pid):
            return None
        if os.fsencode(self.home) not in cmdline(pid):
            return None
        return pid

    def sample_rss(self):
        pid = self.pid()
        if pid:
            self.hwm_kib = max(self.hwm_kib, vm_hwm_kib(pid))

    def outbox(self):
        st = self.status()
        return None if st is None else st.get("outbox")

    def inbound_texts(self, peer_key):
        """Texts of msgs received from `peer_key`, in the order they were stored."""
        r = self.cli("--json", "tail", "--once", "-p", peer_key, timeout=300)
        if r.returncode != 0:
            raise Abort(f"{self.name}: `awp tail --once` exited {r.returncode}: {r.stderr.strip()[:300]}")
        out = []
        for line in r.stdout.splitlines():
            ev = json.loads(line)
            if ev.get("event") != "line" or ev.get("dir") != "in" or ev.get("t") != "msg":
                continue
            texts = [p.get("text", "") for p in ev.get("line", {}).get("parts", []) if p.get("k") == "text"]
            out.append((ev["seq"], texts[0] if texts else ""))
        out.sort()
        return [t for _, t in out]


class Inflight:
    """`awp send` processes currently running, so the driver can SIGKILL one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.procs = {}  # worker name -> (Popen, pidfd or None)

    def add(self, who, proc):
        fd = None
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                fd = None
        with self.lock:
            self.procs[who] = (proc, fd)

    def remove(self, who):
        with self.lock:
            _, fd = self.procs.pop(who, (None, None))
        if fd is not None:
            os.close(fd)

    def kill_one(self, rng):
        """SIGKILL a random in-flight send (through its pidfd: never a recycled pid)."""
        with self.lock:
            if not self.procs:
                return False
            proc, fd = self.procs[rng.choice(sorted(self.procs))]
            try:
                if fd is not None:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                else:
                    proc.send_signal(signal.SIGKILL)
            except (ProcessLookupError, OSError):
                return False
            return True

    def kill_all(self):
        with self.lock:
            for proc, fd in self.procs.values():
                try:
                    if fd is not None:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    else:
                        proc.send_signal(signal.SIGKILL)
                except (ProcessLookupError, OSError):
                    pass


class Worker(threading.Thread):
    """Sends `s<sender>-t<k>-n<counter>` from `node` to `peer` in one AWP thread until told
    to stop, recording each outcome."""

    def __init__(self, node, peer, k, inflight, stop):
        super().__init__(daemon=True, name=f"{node.name}{k}")
        self.node, self.peer, self.k = node, peer, k
        self.inflight, self.stop = inflight, stop
        self.queued = []  # counters, in the order their sends completed
        self.uncertain = {}  # counter -> "killed" | "failed" | "hung"
        self.errors = Counter()  # first line of stderr of failed sends
        self.th = None

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            text = f"s{self.node.name}-t{self.k}-n{n}"
            cmd = [self.node.awp, "--home", self.node.home, "--json", "send"]
            if self.th:
                cmd += ["-t", self.th, text]
            else:
                cmd += [self.peer.key, text, "-s", f"soak {self.node.name} t{self.k}"]
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            except OSError as e:
                self.uncertain[n] = "failed"
                self.errors[f"spawn: {e}"] += 1
                time.sleep(0.1)
                continue
            self.inflight.add(self.name, proc)
            try:
                out, err = proc.communicate(timeout=SEND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                self.uncertain[n] = "hung"
                self.errors[f"no answer within {SEND_TIMEOUT_S} s"] += 1
                continue
            finally:
                self.inflight.remove(self.name)
            if proc.returncode == 0:
                self.queued.append(n)
                if not self.th:
                    try:
                        self.th = json.loads(out)["th"]
                    except (ValueError, KeyError):
                        pass
            elif proc.returncode == -signal.SIGKILL:
                self.uncertain[n] = "killed"
            else:
                self.uncertain[n] = "failed"
                first = (err.strip().splitlines() or [f"exit {proc.returncode}"])[0]
                first = re.sub(r"; its log is \S+", "", first)
                self.errors[re.sub(r"\d+", "N", first)[:160]] += 1
                time.sleep(0.05)  # the node is down: do not spin


def check_direction(sender, workers, texts):
    """Compare what `sender`'s workers recorded with `texts`, the msgs the other node
    stored from `sender`, in the order it stored them."""
    sent = {}  # text -> "queued" | "killed" | "failed" | "hung"
    for w in workers:
        for n in w.queued:
            sent[f"s{sender.name}-t{w.k}-n{n}"] = "queued"
        for n, why in w.uncertain.items():
            sent[f"s{sender.name}-t{w.k}-n{n}"] = why
    counts = Counter(texts)
    lost = sorted((t for t, o in sent.items() if o == "queued" and t not in counts), key=natural)
    dups = sorted(((t, c) for t, c in counts.items() if c > 1), key=lambda x: natural(x[0]))
    unknown = sorted(t for t in counts if t not in sent)
    uncertain = [t for t, o in sent.items() if o != "queued"]
    arrived_uncertain = sum(1 for t in uncertain if t in counts)
    # Order: per worker, the queued counters in arrival order (first arrival) must increase.
    arrival = defaultdict(list)
    first_seen = set()
    for t in texts:
        if t in first_seen or sent.get(t) != "queued":
            continue
        first_seen.add(t)
        m = TEXT_RE.match(t)
        arrival[int(m.group(2))].append(int(m.group(3)))
    reorders = []
    for k, ns in sorted(arrival.items()):
        for prev, cur in zip(ns, ns[1:]):
            if cur < prev:
                reorders.append(f"s{sender.name}-t{k}: n{cur} after n{prev}")
    kinds = Counter(o for o in sent.values() if o != "queued")
    return {
        "queued": sum(1 for o in sent.values() if o == "queued"),
        "uncertain": len(uncertain),
        "uncertain_kinds": dict(kinds),
        "uncertain_arrived": arrived_uncertain,
        "arrived": len(counts),
        "lost": lost,
        "dups": dups,
        "reorders": reorders,
        "unknown": unknown,
    }


def self_check():
    """The checker on made-up outcomes: it must see each kind of fault (else the soak could
    pass whatever the nodes did)."""
    from types import SimpleNamespace as NS

    sender = NS(name="a")
    w0 = NS(k=0, queued=[1, 2, 3, 5], uncertain={4: "killed"})
    w1 = NS(k=1, queued=[1, 2], uncertain={3: "failed"})
    good = ["sa-t0-n1", "sa-t1-n1", "sa-t0-n2", "sa-t0-n3", "sa-t0-n5", "sa-t1-n2", "sa-t1-n3"]
    r = check_direction(sender, [w0, w1], good)
    assert (r["lost"], r["dups"], r["reorders"], r["unknown"]) == ([], [], [], []), r
    assert (r["queued"], r["uncertain"], r["uncertain_arrived"]) == (6, 2, 1), r
    bad = ["sa-t0-n2", "sa-t0-n1", "sa-t0-n3", "sa-t0-n3", "sa-t1-n1", "sa-t9-n1", "sa-t0-n4", "sa-t0-n4"]
    r = check_direction(sender, [w0, w1], bad)
    assert r["lost"] == ["sa-t0-n5", "sa-t1-n2"], r
    assert r["dups"] == [("sa-t0-n3", 2), ("sa-t0-n4", 2)], r
    assert r["reorders"] == ["sa-t0: n1 after n2"], r
    assert r["unknown"] == ["sa-t9-n1"], r


def natural(t):
    m = TEXT_RE.match(t)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else (t, 0, 0)


def sample(items, n=10):
    items = list(items)
    return ", ".join(map(str, items[:n])) + (f", … ({len(items)} in all)" if len(items) > n else "")


def message_soak(args, work, rng, state):
    nodes = {n: Node(args.awp, work, n) for n in ("a", "b")}
    state["nodes"] = list(nodes.values())
    for n in nodes.values():
        err = n.up()
        if err:
            raise Abort(f"{n.name}: first start failed: {err}")
    a, b = nodes["a"], nodes["b"]
    r = a.cli("connect", f"tls:127.0.0.1:{b.port}#{b.key}", "--timeout", "10s")
    if r.returncode != 0:
        raise Abort(f"a could not connect to b: {r.stderr.strip()}")
    log(f"a {a.key} on port {a.port}; b {b.key} on port {b.port}; {args.threads} workers each way")

    inflight = Inflight()
    state["inflight"] = inflight
    stop = threading.Event()
    workers = {
        "a": [Worker(a, b, k, inflight, stop) for k in range(args.threads)],
        "b": [Worker(b, a, k, inflight, stop) for k in range(args.threads)],
    }
    state["stop"] = stop
    state["workers"] = [w for ws in workers.values() for w in ws]
    for w in state["workers"]:
        w.start()

    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60 if args.minutes else None
    cycles = 0
    cli_kill_attempts = 0
    restart_failures = []
    while True:
        if args.cycles is not None and cycles >= args.cycles:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        # Traffic for a random while; on some cycles an in-flight send dies in the middle.
        pause = rng.uniform(args.min_gap, args.max_gap)
        if rng.random() < args.cli_kill_rate:
            split = rng.uniform(0, pause)
            time.sleep(split)
            cli_kill_attempts += inflight.kill_one(rng)
            time.sleep(pause - split)
        else:
            time.sleep(pause)
        victim = nodes[rng.choice("ab")]
        pid = victim.pid()
        if pid is None:
            # Not up (a sending CLI may be starting it right now): give it a moment.
            time.sleep(0.2)
            pid = victim.pid()
        if pid is None:
            # Still not up: no kill this time, but it must come up.
            err = victim.up()
            if err:
                restart_failures.append(f"after cycle {cycles}, {victim.name}: {err}")
                log(f"RESTART FAILURE after cycle {cycles}, {victim.name}: {err}")
                if victim.up():
                    raise Abort(f"{victim.name} does not come up")
            continue
        victim.hwm_kib = max(victim.hwm_kib, vm_hwm_kib(pid))
        kill_pid(pid)
        if not wait_gone(pid):
            raise Abort(f"{victim.name}: pid {pid} still alive {DEATH_TIMEOUT_S} s after SIGKILL")
        victim.kills += 1
        cycles += 1
        time.sleep(rng.uniform(0, args.max_down))
        err = victim.up()
        if err:
            restart_failures.append(f"cycle {cycles}, {victim.name}: {err}")
            log(f"RESTART FAILURE cycle {cycles}, {victim.name}: {err}")
            err = victim.up()
            if err:
                raise Abort(f"{victim.name} does not come back: {err}")
        victim.restarts += 1
        if cycles % 10 == 0:
            sent = sum(len(w.queued) for ws in workers.values() for w in ws)
            log(f"  cycle {cycles}: {sent} sends queued, {time.monotonic() - t0:.0f} s")
    run_s = time.monotonic() - t0

    stop.set()
    for ws in workers.values():
        for w in ws:
            w.join(SEND_TIMEOUT_S + 5)
    for n in nodes.values():
        n.sample_rss()
        if n.status() is None:
            err = n.up()
            if err:
                restart_failures.append(f"after the run, {n.name}: {err}")

    # Drain: both outboxes empty (every queued line acked by the other side's disk).
    t_drain = time.monotonic()
    drained = False
    while time.monotonic() - t_drain < args.drain_timeout:
        if a.outbox() == 0 and b.outbox() == 0:
            drained = True
            break
        time.sleep(0.2)
    drain_s = time.monotonic() - t_drain
    for n in nodes.values():
        n.sample_rss()

    results = {
        "a": check_direction(a, workers["a"], b.inbound_texts(a.key)),
        "b": check_direction(b, workers["b"], a.inbound_texts(b.key)),
    }
    cli_kills = sum(r["uncertain_kinds"].get("killed", 0) for r in results.values())

    print(f"cycles          {cycles} in {run_s:.1f} s (SIGKILLs: a {a.kills}, b {b.kills}; "
          f"in-flight awp send {cli_kills} of {cli_kill_attempts} tried)")
    ok = drained and not restart_failures
    for s, r in results.items():
        o = "b" if s == "a" else "a"
        kinds = ", ".join(f"{v} {k}" for k, v in sorted(r["uncertain_kinds"].items())) or "none"
        print(f"{s} -> {o}          {r['queued']} queued, {r['arrived']} arrived; "
              f"LOST {len(r['lost'])} DUP {len(r['dups'])} REORDER {len(r['reorders'])}"
              + (f" UNKNOWN {len(r['unknown'])}" if r["unknown"] else ""))
        print(f"  uncertain     {r['uncertain']} ({kinds}), {r['uncertain_arrived']} of them arrived")
        if r["lost"]:
            print(f"  lost: {sample(r['lost'])}")
        if r["dups"]:
            print(f"  dup: {sample(f'{t} x{c}' for t, c in r['dups'])}")
        if r["reorders"]:
            print(f"  reorder: {sample(r['reorders'])}")
        if r["unknown"]:
            print(f"  unknown: {sample(r['unknown'])}")
        ok = ok and not (r["lost"] or r["dups"] or r["reorders"] or r["unknown"])
    errors = Counter()
    for ws in workers.values():
        for w in ws:
            errors.update(w.errors)
    for msg, c in errors.most_common(3):
        print(f"  failed sends  {c}x {msg}")
    print(f"restart failures {len(restart_failures)}")
    for f in restart_failures[:10]:
        print(f"  {f}")
    print(f"drain           {drain_s:.1f} s" + ("" if drained else f" (NOT drained: a {a.outbox()}, b {b.outbox()})"))
    print(f"peak RSS        a {a.hwm_kib / 1024:.1f} MiB, b {b.hwm_kib / 1024:.1f} MiB (VmHWM before each kill)")
    if not ok:
        print(f"  reproduce: scripts/soak.sh --cycles {cycles} --threads {args.threads} --seed {args.seed} --keep"
              " (the same random choices, not the same timing; --keep keeps both homes and their node.log)")
    return ok


def store_soak(args, work, rng, state):
    """Kill the store writer `args.cycles` times (or for `args.minutes`), reopening and
    checking the store after every kill."""
    db = os.path.join(work, "store")
    records = os.path.join(work, "flushed.txt")
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60 if args.minutes else None
    cycles = 0
    failures = []
    last = {}
    check_s = []
    open_s = []
    during_open = 0
    rollbacks = replays = torn = 0
    while True:
        if args.cycles is not None and cycles >= args.cycles:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        with open(records, "ab") as out:
            t_spawn = time.monotonic()
            proc = subprocess.Popen(
                [args.store_writer, "write", db, str(args.threads)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
            )
            state["writer"] = proc
            if rng.random() < 0.25:
                # Anywhere, also while the store opens (recovering from the last kill).
                time.sleep(rng.uniform(0, args.max_gap / 4))
                during_open += not select.select([proc.stderr], [], [], 0)[0]
            else:
                # During the writes: after the writer says `open`.
                ready, _, _ = select.select([proc.stderr], [], [], UP_TIMEOUT_S)
                if not ready:
                    failures.append(f"cycle {cycles + 1}: the store did not open within {UP_TIMEOUT_S} s")
                    proc.kill()
                    proc.communicate(timeout=DEATH_TIMEOUT_S)
                    break
                open_s.append(time.monotonic() - t_spawn)
                time.sleep(rng.uniform(args.min_gap / 4, args.max_gap / 4))
            proc.kill()
            _, err = proc.communicate(timeout=DEATH_TIMEOUT_S)
        cycles += 1
        if proc.returncode not in (-signal.SIGKILL, None):
            err = err.decode(errors="replace").replace("open\n", "", 1).strip()
            failures.append(f"cycle {cycles}: the writer exited {proc.returncode} before the kill: {err[:300]}")
            break
        t_check = time.monotonic()
        try:
            r = subprocess.run([args.store_writer, "check", db, records], capture_output=True,
                               text=True, timeout=120)
        except subprocess.TimeoutExpired:
            failures.append(f"cycle {cycles}: the check did not finish within 120 s")
            break
        check_s.append(time.monotonic() - t_check)
        rollbacks += "rolled back the part of commit" in r.stderr
        replays += "journal records (LSN" in r.stderr
        torn += "not completely written" in r.stderr
        if "the journal is damaged" in r.stderr:
            # A kill stops writes; it cannot damage a record inside the journal.
            failures.append(f"cycle {cycles}: the open took the journal for damaged: {r.stderr.strip()[:600]}")
            break
        if r.returncode != 0:
            failures.append(f"cycle {cycles}: {(r.stdout + r.stderr).strip()[:600]}")
            break
        last = json.loads(r.stdout)
        if cycles % 50 == 0:
            log(f"  cycle {cycles}: {last.get('records')} records held, {time.monotonic() - t0:.0f} s")
    run_s = time.monotonic() - t0
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(db) for f in fs) if os.path.isdir(db) else 0
    print(f"store cycles    {cycles} SIGKILLs of the writer in {run_s:.1f} s ({args.threads} writer tasks; "
          f"{during_open} of them before the store had opened)")
    print(f"records         {last.get('records', 0)} flushed and held "
          f"({last.get('enqueued', 0)} queued, {last.get('acked', 0)} acked, {last.get('received', 0)} received)")
    for what, xs in (("open after kill", open_s), ("reopen+check", check_s)):
        if xs:
            print(f"{what:<15} median {sorted(xs)[len(xs) // 2]:.2f} s, max {max(xs):.2f} s")
    print(f"repairs         {rollbacks} opens rolled back a commit a kill cut short, "
          f"{replays} applied journal records, {torn} ended in a record cut short")
    print(f"store size      {size / 1048576:.1f} MiB on disk")
    print(f"failures        {len(failures)}")
    for f in failures:
        print(f"  {f}")
    if failures:
        print(f"  reproduce: scripts/soak.sh --store --cycles {cycles} --threads {args.threads} --seed {args.seed}"
              " --keep (the same random choices, not the same timing; --keep keeps the store and records)")
    return not failures


def cleanup(work, state, keep):
    # Workers first (a send to a dead node would start it again), then the nodes.
    stop = state.get("stop")
    if stop:
        stop.set()
    inflight = state.get("inflight")
    if inflight:
        inflight.kill_all()
    for w in state.get("workers", []):
        w.join(SEND_TIMEOUT_S)
        if inflight:
            inflight.kill_all()
    proc = state.get("writer")
    if proc and proc.poll() is None:
        proc.kill()
    for n in state.get("nodes", []):
        try:
            n.cli("down", timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            pass
    # Anything still running from our homes (a node a killed CLI was starting), by pid.
    for _ in range(5):
        pids = pids_under(work)
        if not pids:
            break
        for pid in pids:
            kill_pid(pid)
        time.sleep(0.2)
    if keep:
        log(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--awp", required=True, help="the awp executable")
    p.add_argument("--store-writer", help="the store_crash example executable (--store)")
    p.add_argument("--store", action="store_true", help="store mode: SIGKILL a store writer, reopen, check")
    p.add_argument("--cycles", type=int, help="SIGKILLs (default 30, or unbounded with --minutes)")
    p.add_argument("--minutes", type=float, help="stop after this long (with --cycles: whichever first)")
    p.add_argument("--threads", type=int, help="senders each way (default 10) / writer threads (default 4)")
    p.add_argument("--cli-kill-rate", type=float, default=0.3, help="chance per cycle of killing an in-flight send")
    p.add_argument("--min-gap", type=float, default=0.2, help="shortest traffic time before a kill, s")
    p.add_argument("--max-gap", type=float, default=2.0, help="longest traffic time before a kill, s")
    p.add_argument("--max-down", type=float, default=0.5, help="longest time a killed node stays down, s")
    p.add_argument("--drain-timeout", type=float, default=180, help="how long the outboxes may take to drain, s")
    p.add_argument("--seed", type=int, help="seed of the random choices (printed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary homes (printed at the end)")
    args = p.parse_args()
    if args.cycles is None and args.minutes is None:
        args.cycles = 30
    if args.threads is None:
        args.threads = 4 if args.store else 10
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    if args.store and not args.store_writer:
        p.error("--store needs --store-writer")
    if not (0 < args.threads <= 200) or (args.cycles is not None and args.cycles < 0):
        p.error("--threads must be 1..200 and --cycles not negative")
    rng = random.Random(args.seed)
    self_check()

    work = tempfile.mkdtemp(prefix="awp-soak.")
    os.chmod(work, 0o700)
    state = {}

    def on_signal(signum, _frame):
        raise Abort(f"interrupted by signal {signum}")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    print(f"seed            {args.seed}")
    t0 = time.monotonic()
    ok = False
    try:
        ok = (store_soak if args.store else message_soak)(args, work, rng, state)
    except Abort as e:
        print(f"ABORTED: {e}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cleanup(work, state, args.keep)
    print(f"total           {time.monotonic() - t0:.1f} s")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
