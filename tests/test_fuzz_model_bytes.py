"""Fuzzing model bytes: a mutated model is refused with an onnxep error or runs; nothing else.

Each model in tests/data (and tests/data/genai) is mutated with a seeded RNG:
bit flips (half of them aimed at the protobuf structure rather than at weight
bytes), truncation, a byte range spliced in from another model, a range of
the model duplicated elsewhere, or one protobuf field set to an edge value,
dropped or duplicated (the field name picked uniformly, so opsets, attribute
values, dims and names are hit as often as the many value_info entries).
Each mutated model is loaded with
``onnxep.InferenceSession(bytes, providers=["cpu"])`` (genai models, whose
weights are external, from a folder holding their data) and, when it loads,
run once with random feeds. Success and ``OnnxepError`` subclasses are the only
acceptable outcomes: a bare exception, a crash or a hang fails the test with
the recipe that rebuilds the case (``mutate(recipe)``).

Cases run in worker processes forked from a clean server, so a crash or a
hang costs one worker, not the test run; a per-case timer and an address-space
limit guard against hangs and runaway allocations. The tally is printed
(``pytest -s``) and recorded as the test's ``fuzz_tally`` property. The
default run makes 250 cases per model (2000) and leaves out running inputs
over 4096 elements (the CNN, whose first run times GEMM variants for
seconds); ``-m slow`` makes 600 per model and runs everything.
``ONNXEP_FUZZ_CASES`` / ``ONNXEP_FUZZ_SLOW_CASES`` change the counts.
"""

from __future__ import annotations

import collections
import functools
import json
import multiprocessing
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

import onnx
import pytest
from google.protobuf.message import Message

DATA = Path(__file__).parent / "data"
SEED = 20251201
CASE_SECONDS = 20.0  # the worker's own timer; the parent kills a worker silent for twice that
MEMORY_HEADROOM = 2 << 30  # address space a worker may grow by
#: Cases whose feeds would hold more elements are loaded but not run: the quick
#: run leaves out the CNN, whose first run times its GEMM variants (seconds).
QUICK_FEED_ELEMENTS = 4096
SLOW_FEED_ELEMENTS = 1 << 22
#: Symbolic dims of the decoders' exports: one new token after one cached one.
DECODE_DIMS = {
    "seq": 1,
    "sequence_length": 1,
    "past": 1,
    "past_sequence_length": 1,
    "total": 2,
    "total_sequence_length": 2,
}
#: Cases per model: the default run, and the slow run (pytest -m slow).
QUICK_CASES = int(os.environ.get("ONNXEP_FUZZ_CASES", "250"))
SLOW_CASES = int(os.environ.get("ONNXEP_FUZZ_SLOW_CASES", "600"))


@dataclass(frozen=True)
class Seed:
    """One model to mutate: its bytes, the byte ranges that are not weight data, its folder."""

    name: str
    data: bytes
    structure: tuple[tuple[int, int], ...]
    external_dir: Path | None  # the folder holding its external data, if any
    dims: dict[str, int]  # symbolic dims for its random feeds


def _structure(data: bytes, proto: onnx.ModelProto) -> tuple[tuple[int, int], ...]:
    """Byte ranges outside the large raw_data blobs (where a flip changes weights only)."""
    blobs = []
    for t in proto.graph.initializer:
        raw = t.raw_data
        if len(raw) >= 256:
            at = data.find(raw)
            if at >= 0:
                blobs.append((at, at + len(raw)))
    ranges, pos = [], 0
    for start, end in sorted(blobs):
        if start > pos:
            ranges.append((pos, start))
        pos = max(pos, end)
    if pos < len(data):
        ranges.append((pos, len(data)))
    return tuple(ranges)


def seeds() -> list[Seed]:
    from onnxep.generation.spec import model_dims

    found = []
    for path in sorted(DATA.glob("*.onnx")) + sorted(DATA.glob("genai/*/model.onnx")):
        data = path.read_bytes()
        proto = onnx.load_from_string(data)
        external = any(
            onnx.external_data_helper.uses_external_data(t) for t in proto.graph.initializer
        )
        name = str(path.relative_to(DATA))
        dims = {**DECODE_DIMS, **model_dims(str(path))}
        folder = path.parent if external else None
        found.append(Seed(name, data, _structure(data, proto), folder, dims))
    return found


@functools.cache
def seed_table() -> dict[str, Seed]:
    return {s.name: s for s in seeds()}


# -- mutations ------------------------------------------------------------------------


def _position(rng: random.Random, seed: Seed) -> int:
    """A byte position: half the time anywhere, half the time in the protobuf structure."""
    if rng.random() < 0.5 or not seed.structure:
        return rng.randrange(len(seed.data))
    total = sum(end - start for start, end in seed.structure)
    pick = rng.randrange(total)
    for start, end in seed.structure:
        if pick < end - start:
            return start + pick
        pick -= end - start
    raise AssertionError("unreachable")


#: Repeated numeric fields that hold tensor data: a few entries stand for all.
_BULK = {"float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"}
#: Where a field sits: (field name, index in a repeated field or None) from the model down.
FieldPath = tuple[tuple[str, int | None], ...]


@functools.cache
def _parsed(name: str) -> onnx.ModelProto:
    """The seed's proto, parsed once; read it, never change it."""
    proto = onnx.ModelProto()
    proto.ParseFromString(seed_table()[name].data)
    return proto


@functools.cache
def _fields(name: str) -> dict[str, list[tuple[FieldPath, str]]]:
    """The model's set fields, by field name: (path, kind) with kind scalar or repeated item."""
    out: dict[str, list[tuple[FieldPath, str]]] = collections.defaultdict(list)

    def walk(msg, path: FieldPath) -> None:
        for fd, value in msg.ListFields():
            if fd.name == "raw_data":
                continue
            repeated = (
                fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
            )
            if fd.type == fd.TYPE_MESSAGE:
                if repeated:
                    for i, sub in enumerate(value):
                        out[fd.name].append(((*path, (fd.name, i)), "item"))
                        walk(sub, (*path, (fd.name, i)))
                else:
                    walk(value, (*path, (fd.name, None)))
            elif repeated:
                count = min(len(value), 4) if fd.name in _BULK else len(value)
                out[fd.name] += [(((*path, (fd.name, i))), "item") for i in range(count)]
            else:
                out[fd.name].append(((*path, (fd.name, None)), "scalar"))

    walk(_parsed(name), ())
    return dict(out)


def _resolve(proto: onnx.ModelProto, path: FieldPath):
    """The message holding the path's last field."""
    msg = proto
    for field, index in path[:-1]:
        msg = getattr(msg, field) if index is None else getattr(msg, field)[index]
    return msg


def _interesting(rng: random.Random, old, strings: list[str]):
    """A value for a field that held ``old``: an edge case, a neighbour, or another name."""
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        edges = [0, 1, -1, 2, 3, 7, 255, 2**31 - 1, -(2**31), 2**40, -(2**40)]
        return rng.choice([*edges, old + 1, old - 1, -old, old * 2])
    if isinstance(old, float):
        return rng.choice(["nan", "inf", 0.0, -1.0, 1e30, old * 2])
    if isinstance(old, bytes):
        return rng.choice([b"", b"\xff", old + old])
    return rng.choice(["", old + "_x", *rng.sample(strings, min(len(strings), 3))])


def make_recipe(rng: random.Random, seed: Seed) -> tuple:
    """One mutation of ``seed`` as plain data: rebuild it with ``mutate(recipe)``."""
    kinds = ["flip", "truncate", "splice", "duplicate", "field"]
    kind = rng.choices(kinds, weights=[4, 1, 2, 1, 4])[0]
    n = len(seed.data)
    if kind == "flip":
        flips = tuple((_position(rng, seed), rng.randrange(8)) for _ in range(rng.randint(1, 8)))
        return ("flip", seed.name, flips)
    if kind == "truncate":
        return ("truncate", seed.name, rng.randrange(n))
    if kind == "field":
        return _field_recipe(rng, seed)
    length = rng.randint(1, 64)
    dst = _position(rng, seed)
    replace = rng.choice([0, length])  # insert, or overwrite as many bytes
    if kind == "splice":
        donor = seed_table()[rng.choice(sorted(seed_table()))]
        src = _position(rng, donor)
        return ("splice", seed.name, donor.name, src, length, dst, replace)
    return ("duplicate", seed.name, _position(rng, seed), length, dst, replace)


def _field_recipe(rng: random.Random, seed: Seed) -> tuple:
    """Set, drop or duplicate one field, the field name picked uniformly (not by count)."""
    fields = _fields(seed.name)
    name = rng.choice(sorted(fields))
    path, kind = rng.choice(fields[name])
    field, index = path[-1]
    old = getattr(_resolve(_parsed(seed.name), path), field)
    if index is not None:
        old = old[index]
    if kind == "item" and (isinstance(old, Message) or rng.random() < 0.5):
        return ("field", seed.name, rng.choice(["drop", "dup"]), path, None)
    return (
        "field",
        seed.name,
        "set",
        path,
        _interesting(rng, old, _strings_like(seed.name, field)),
    )


@functools.cache
def _strings_like(name: str, field: str) -> list[str]:
    """Values other fields of the same name hold (value names, op types, domains...)."""
    proto = _parsed(name)
    values = set()
    for path, _ in _fields(name).get(field, []):
        field_name, index = path[-1]
        v = getattr(_resolve(proto, path), field_name)
        v = v[index] if index is not None else v
        if isinstance(v, str):
            values.add(v)
    return sorted(values)


def _apply_field(data: bytes, op: str, path: FieldPath, value) -> bytes:
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    holder = _resolve(proto, path)
    field, index = path[-1]
    if op == "drop":
        del getattr(holder, field)[index]
    elif op == "dup":
        items = getattr(holder, field)
        item = items[index]
        if isinstance(item, Message):
            items.add().CopyFrom(item)
        else:
            items.append(item)
    else:
        if value in ("nan", "inf"):
            value = float(value)
        try:
            if index is None:
                setattr(holder, field, value)
            else:
                getattr(holder, field)[index] = value
        except (ValueError, TypeError):
            pass  # out of the field's range (an int32 or a closed enum): the model stays as is
    return proto.SerializeToString()


def mutate(recipe: tuple) -> bytes:
    kind, name = recipe[0], recipe[1]
    if kind == "field":
        return _apply_field(seed_table()[name].data, *recipe[2:])
    data = bytearray(seed_table()[name].data)
    if kind == "flip":
        for pos, bit in recipe[2]:
            data[pos] ^= 1 << bit
        return bytes(data)
    if kind == "truncate":
        return bytes(data[: recipe[2]])
    if kind == "splice":
        donor, src, length, dst, replace = recipe[2:]
        piece = seed_table()[donor].data[src : src + length]
    else:
        src, length, dst, replace = recipe[2:]
        piece = bytes(data[src : src + length])
    data[dst : dst + replace] = piece
    return bytes(data)


# -- one case, in a worker ------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised by the worker's timer; a BaseException so no ``except Exception`` swallows it."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


def _feeds(sess, seed: Seed, max_elements: int):
    """Random feeds, or the reason the case is not run."""
    from onnxep.errors import InvalidArgument
    from onnxep.testing import random_inputs

    total = 0
    for arg in sess.get_inputs():
        if not arg.type.startswith("tensor("):
            return None, "not run (non-tensor input)"
        size = 1
        for d in arg.shape or []:
            size *= d if isinstance(d, int) and d > 0 else seed.dims.get(d, 1)
        total += size
    if total > max_elements:
        return None, f"not run (inputs over {max_elements} elements)"
    try:
        return random_inputs(sess, seed.dims, default_dim=1), None
    except InvalidArgument as exc:
        return None, f"not run (random_inputs: {type(exc).__name__})"


def run_case(recipe: tuple, folder: Path, max_elements: int = SLOW_FEED_ELEMENTS) -> str:
    """The outcome of one case; an unexpected exception propagates to the caller."""
    import onnxep
    from onnxep.errors import OnnxepError

    if recipe[0] == "selftest":
        return _misbehave(recipe[1])

    blob = mutate(recipe)
    seed = seed_table()[recipe[1]]
    model: object = blob
    if seed.external_dir is not None:
        model = folder / seed.external_dir.name / "case.onnx"
        model.write_bytes(blob)
    try:
        sess = onnxep.InferenceSession(model, providers=["cpu"])
    except OnnxepError as exc:
        return f"load: {type(exc).__name__}"
    feeds, skipped = _feeds(sess, seed, max_elements)
    if skipped:
        return f"loaded, {skipped}"
    try:
        sess.run(None, feeds)
    except OnnxepError as exc:
        return f"loaded, run: {type(exc).__name__}"
    return "loaded+ran"


def _misbehave(how: str) -> str:
    """Each failure the harness must catch, on demand (``test_harness_reports_...``)."""
    if how == "bare":
        raise KeyError("a bare exception")
    if how == "crash":
        os.abort()
    if how == "hang":
        time.sleep(3600)  # the worker's timer interrupts this
    if how == "stuck":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as if stuck in C code
        time.sleep(3600)
    return "loaded+ran"


def worker(
    cases: list[tuple[int, tuple]],
    conn: Connection,
    folder: str,
    max_elements: int,
    case_seconds: float,
) -> None:
    """Run cases in order, reporting each start and outcome through ``conn``."""
    import logging
    import resource
    import warnings

    # Mutated weights overflow and onnx-ir logs what it skips: expected, and noise here.
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, resource.RLIM_INFINITY))
    signal.signal(signal.SIGALRM, _on_alarm)
    work = Path(folder)
    for index, recipe in cases:
        conn.send(("start", index))
        signal.setitimer(signal.ITIMER_REAL, case_seconds)
        try:
            outcome = run_case(recipe, work, max_elements)
        except CaseTimeout:
            outcome = f"FAIL hang (over {case_seconds}s)"
        except BaseException as exc:  # noqa: BLE001 - every escape is the finding
            outcome = f"FAIL bare {type(exc).__module__}.{type(exc).__name__}: {exc}"[:400]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        conn.send(("done", index, outcome))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    conn.send(("end", usage.ru_utime + usage.ru_stime))


# -- the parent: workers, crashes and hangs -------------------------------------------


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["onnxep", "onnx", "numpy", __name__])
    return ctx


def fuzz(
    cases: list[tuple],
    workdir: Path,
    jobs: int,
    max_elements: int,
    case_seconds: float = CASE_SECONDS,
) -> tuple[dict[int, str], float]:
    """Each case's outcome, and the workers' CPU seconds.

    A worker that dies or stalls is replaced, and the case it was on recorded.
    """
    ctx = _context()
    pending = collections.deque(enumerate(cases))
    outcomes: dict[int, str] = {}
    cpu = 0.0
    running: dict[Connection, list] = {}  # conn -> [process, case index, last heard, slot, batch]

    def start(slot: int) -> None:
        batch = []
        while pending and len(batch) < 200:
            batch.append(pending.popleft())
        if not batch:
            return
        folder = workdir / f"w{slot}"
        folder.mkdir(parents=True, exist_ok=True)
        recv, send = ctx.Pipe(duplex=False)
        args = (batch, send, str(folder), max_elements, case_seconds)
        proc = ctx.Process(target=worker, args=args, daemon=True)
        proc.start()
        send.close()
        running[recv] = [proc, None, time.monotonic(), slot, batch]

    for slot in range(jobs):
        start(slot)
    while running:
        for conn in wait(list(running), timeout=1.0):
            state = running[conn]
            try:
                msg = conn.recv()
            except EOFError:
                proc, index, _, slot, batch = state
                proc.join(5)
                if index is None:
                    # Died before its first case: the harness is broken, not a model.
                    raise RuntimeError(
                        f"a fuzz worker exited (code {proc.exitcode}) before its first case; "
                        "is this module importable by name in a fresh process?"
                    ) from None
                if index not in outcomes:
                    outcomes[index] = f"FAIL crash (exit code {proc.exitcode})"
                pending.extendleft(reversed([c for c in batch if c[0] not in outcomes]))
                del running[conn]
                start(slot)
                continue
            state[2] = time.monotonic()
            if msg[0] == "start":
                state[1] = msg[1]
            elif msg[0] == "done":
                outcomes[msg[1]] = msg[2]
            elif msg[0] == "end":
                cpu += msg[1]
        now = time.monotonic()
        for conn, (proc, index, heard, slot, batch) in list(running.items()):
            if now - heard > 2 * case_seconds:
                proc.kill()
                proc.join(5)
                if index is None:
                    raise RuntimeError("a fuzz worker stalled before its first case")
                outcomes[index] = f"FAIL hang (worker killed after {2 * case_seconds}s)"
                pending.extendleft(reversed([c for c in batch if c[0] not in outcomes]))
                del running[conn]
                start(slot)
    return outcomes, cpu


def _external_copies(workdir: Path, jobs: int) -> None:
    """Each worker gets a folder per genai model holding its data, as the model expects."""
    for slot in range(jobs):
        for seed in seed_table().values():
            if seed.external_dir is None:
                continue
            folder = workdir / f"w{slot}" / seed.external_dir.name
            folder.mkdir(parents=True, exist_ok=True)
            for data in seed.external_dir.glob("*.data"):
                # A copy: onnx refuses hard-linked data files.
                shutil.copyfile(data, folder / data.name)


def _check(per_model: int, max_elements: int, tmp_path: Path, record_property) -> None:
    names = sorted(seed_table())
    jobs = 2
    rng = random.Random(SEED)
    recipes = [make_recipe(rng, seed_table()[name]) for name in names for _ in range(per_model)]
    _external_copies(tmp_path, jobs)
    started = time.monotonic()
    outcomes, cpu = fuzz(recipes, tmp_path, jobs, max_elements)
    seconds = time.monotonic() - started
    tally = collections.Counter("FAIL" if o.startswith("FAIL") else o for o in outcomes.values())
    record_property("fuzz_tally", json.dumps(dict(tally)))
    record_property("fuzz_cpu_seconds", round(cpu))
    print(
        f"\nfuzzed {len(outcomes)} mutated models ({per_model} per model, seed {SEED}) "
        f"in {seconds:.0f}s with {jobs} workers ({cpu:.0f} CPU seconds):"
    )
    for outcome, count in tally.most_common():
        print(f"  {count:6d}  {outcome}")
    failures = [
        f"{outcomes[i]}\n    mutate({recipes[i]!r})"
        for i in sorted(outcomes)
        if outcomes[i].startswith("FAIL")
    ]
    assert len(outcomes) == len(recipes)
    assert not failures, (
        f"{len(failures)} case(s) failed; rebuild one with tests/ on sys.path: "
        "test_fuzz_model_bytes.mutate(recipe) gives the model bytes (a genai model's "
        "bytes go beside a copy of its .data file), run_case(recipe, folder) replays it\n"
        + "\n".join(failures[:40])
    )


def test_mutated_models_fail_only_with_onnxep_errors(tmp_path, record_property):
    _check(QUICK_CASES, QUICK_FEED_ELEMENTS, tmp_path, record_property)


@pytest.mark.slow
def test_many_mutated_models_fail_only_with_onnxep_errors(tmp_path, record_property):
    _check(SLOW_CASES, SLOW_FEED_ELEMENTS, tmp_path, record_property)


def test_harness_reports_bare_errors_crashes_and_hangs(tmp_path):
    """The fuzz harness itself: each kind of failure is caught, and the cases after it run."""
    kinds = ["ok", "bare", "crash", "ok", "hang", "stuck", "ok"]
    outcomes, _ = fuzz([("selftest", k) for k in kinds], tmp_path, 1, 0, case_seconds=1.0)
    got = [outcomes[i] for i in range(len(kinds))]
    assert got[0] == got[3] == got[6] == "loaded+ran"
    assert got[1].startswith("FAIL bare builtins.KeyError")
    assert got[2].startswith("FAIL crash")
    assert got[4] == "FAIL hang (over 1.0s)"
    assert got[5].startswith("FAIL hang (worker killed")
