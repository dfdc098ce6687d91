"""The raw samples of result rows, parsed once.

A measured row keeps its samples in ``samples_ms``: a JSON list of rounds, each a list of call
times in ms (:func:`flyexplore.measure.timing.samples_json`). Every sample-based interval
(:func:`flyexplore.results.table.speedup`, :func:`flyexplore.results.compare.pair`) needs, per row,
the per-round medians (:func:`flyexplore.measure.stats.round_values`) and a few statistics of them.
This module gives them as :class:`Parsed` records:

* **in batches**: the texts are parsed by pyarrow's JSON reader (C++, several threads) as one
  newline-delimited buffer, and the per-round medians and statistics are computed with numpy
  for all rows of one length at once. A text pyarrow cannot take (``NaN`` tokens, a newline
  inside, another shape) is parsed by :func:`flyexplore.measure.timing.rounds_from_json`, which
  also raises what it raises for a damaged text. Both ways give the same numbers: a float is
  read correctly rounded by either parser, and the statistics are the functions of
  :mod:`flyexplore.measure.stats` (the test ``tests/results/test_samples.py`` holds them equal).
* **once per text**: a process-wide cache keyed by the text itself (exact: no hash stands for
  it) keeps what was parsed, bounded by :data:`CACHE_BYTES`; the report, the figures and the
  panel calling the speedup rules again on the rows of one file parse nothing again. Parsing a
  10,000-row CPU sweep (about 80 MB of samples) takes about half a second on 2 cores; a cache
  hit costs a dictionary look-up.
* **once per arrow array**: the look-up itself takes each text out of the column as Python text
  and hashes it (about 50 ms for those 80 MB), so :func:`parse_column` also keeps, per arrow
  chunk of an arrow-backed column, the records of the rows it parsed there, keyed by the chunk's
  buffers. Arrow arrays are immutable (pandas replaces a column's array on every assignment,
  never writes into it) and the memo holds the chunk, so its buffers cannot be freed and their
  addresses given to other text while it is remembered: a key names one text per row for as
  long as it is kept. Bounded by :data:`ARRAY_MEMO_BYTES` of chunks; a second call of the rules on
  one frame (``fx.speedup`` then ``fx.geomean``, or validation then the intervals) reads numpy.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flyexplore.measure import stats as S
from flyexplore.measure import timing

#: Confidence of each side's median interval in an unpaired ratio: both hold together with
#: probability >= :data:`flyexplore.measure.stats.CONFIDENCE` (:func:`flyexplore.measure.stats.unpaired_ratio`).
SIDE_CONFIDENCE = math.sqrt(S.CONFIDENCE)

#: Upper bound of the cache: the texts' characters plus the per-round medians' bytes. Past it
#: the oldest entries are dropped (a 10,000-row CPU sweep takes about 140 MB).
CACHE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Parsed:
    """One row's samples, parsed.

    ``rounds``: rounds stored (empty ones included); ``values``: the per-round medians in round
    order, empty rounds skipped (float64, ms; :func:`flyexplore.measure.stats.round_values`);
    ``median``: their median (NaN when there are none, or NaN among them); ``lo``, ``hi``: the
    order-statistic interval of that median at :data:`SIDE_CONFIDENCE`
    (:func:`flyexplore.measure.stats.median_ci`; NaN with too few values); ``drift``:
    :func:`flyexplore.measure.stats.drift` of the values."""

    rounds: int
    values: np.ndarray
    median: float
    lo: float
    hi: float
    drift: float


def summarize(rounds: int, values: np.ndarray) -> Parsed:
    """The :class:`Parsed` record of per-round medians ``values`` (float64, ms) from ``rounds``
    stored rounds, by the scalar functions of :mod:`flyexplore.measure.stats`."""
    values = np.asarray(values, dtype=float)
    med = float(np.median(values)) if values.size else math.nan
    lo, hi = S.median_ci(values, SIDE_CONFIDENCE)
    return Parsed(int(rounds), values, med, lo, hi, S.drift(values))


EMPTY = summarize(0, np.asarray([], dtype=float))

#: Upper bound of the per-array memo of :func:`parse_column`: the bytes of the arrow chunks it
#: holds (their text; the records are the text cache's). Past it the oldest chunks are dropped.
ARRAY_MEMO_BYTES = 256 * 2**20

_cache: dict[str, Parsed] = {}
_cache_bytes = [0]
#: chunk key -> (the chunk, its rows' records (object), their medians (float64, ms), whether
#: each row was parsed (bool))
_memo: dict[tuple, tuple] = {}
_memo_bytes = [0]
#: The live sweep panel's UI thread and the caller's thread may both fill the cache.
_lock = threading.Lock()


def clear_cache() -> None:
    """Forget every parsed text and every remembered arrow chunk (tests; memory)."""
    with _lock:
        _cache.clear()
        _cache_bytes[0] = 0
        _memo.clear()
        _memo_bytes[0] = 0


def _chunk_key(chunk) -> tuple:
    """What names an arrow chunk's rows while the memo holds the chunk: its type, offset, length
    and each buffer's address and size (a buffer alive cannot share its address with another)."""
    return (str(chunk.type), chunk.offset, len(chunk),
            *((b.address, b.size) if b is not None else None for b in chunk.buffers()))


def _memo_rows(chunk) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The memo's arrays of ``chunk``: each row's record (object), its median (float64, ms) and
    whether it was parsed (bool); made, empty, when the chunk is new and fits the bound; None
    when it does not fit."""
    key = _chunk_key(chunk)
    with _lock:
        hit = _memo.get(key)
        if hit is not None:
            return hit[1:]
        size = chunk.nbytes
        if size > ARRAY_MEMO_BYTES:
            return None
        rows, med = np.full(len(chunk), None, dtype=object), np.full(len(chunk), np.nan)
        have = np.zeros(len(chunk), dtype=bool)
        _memo[key] = (chunk, rows, med, have)
        _memo_bytes[0] += size
        while _memo_bytes[0] > ARRAY_MEMO_BYTES and len(_memo) > 1:
            old = next(iter(_memo))
            _memo_bytes[0] -= _memo.pop(old)[0].nbytes
        return rows, med, have


def _remember(text: str, p: Parsed) -> None:
    size = len(text) + p.values.nbytes + 200
    if size > CACHE_BYTES:
        return
    with _lock:
        if text in _cache:
            return
        _cache[text] = p
        _cache_bytes[0] += size
        while _cache_bytes[0] > CACHE_BYTES and _cache:
            old = next(iter(_cache))
            q = _cache.pop(old)
            _cache_bytes[0] -= len(old) + q.values.nbytes + 200


def parse(texts: Sequence) -> list[Parsed]:
    """The :class:`Parsed` record of each of ``texts`` (``samples_ms`` cells, in order): a
    missing value (None, NA, NaN) or an empty text is :data:`EMPTY`, as
    :func:`flyexplore.measure.timing.rounds_from_json` reads it. Texts seen before (this call or
    an earlier one, while cached) are not parsed again. Raises what
    :func:`~flyexplore.measure.timing.rounds_from_json` raises for a text that is not a JSON list
    of lists of numbers (``json.JSONDecodeError``, ``TypeError``, ``ValueError``)."""
    out: list = [None] * len(texts)
    todo: dict[str, list[int]] = {}
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t:
            out[i] = EMPTY
            continue
        hit = _cache.get(t)
        if hit is not None:
            out[i] = hit
        else:
            todo.setdefault(t, []).append(i)
    if todo:
        new = list(todo)
        for t, p in zip(new, _parse_many(new)):
            _remember(t, p)
            for i in todo[t]:
                out[i] = p
    return out


#: Text parsed by pyarrow at once, characters: the parser's buffers (the text twice, the numbers,
#: their per-round medians) are a few times this, so a batch bounds the memory a parse takes
#: whatever the number of rows (10,000 CPU rows are about 60 MB of text: four batches).
BATCH_CHARS = 16 * 2**20


#: Rows whose texts :func:`parse_column` takes out of a column at once: the Python text of
#: at most this many rows exists at a time (besides what the cache keeps).
COLUMN_ROWS = 4096


def parse_column(column, positions: np.ndarray) -> list[Parsed]:
    """:func:`parse` of the ``samples_ms`` cells at ``positions`` (int, in any order) of
    ``column`` (a pandas Series), in that order, taken out :data:`COLUMN_ROWS` rows at a time.
    An arrow-backed text column is read chunk by chunk, each touched chunk sliced where the rows
    are: pyarrow's ``take`` on a column of many chunks (one per concatenated frame) copies them
    all first, and the whole column as Python text is its size several times over; the rows of
    a chunk parsed before are read from the memo of arrow chunks (module text). Raises
    :class:`BadSamples` naming the first row whose text does not parse."""
    return _column(column, positions, medians=False).tolist()


def column_medians(column, positions: np.ndarray) -> np.ndarray:
    """The ``median`` of :func:`parse_column`'s records, as float64 (ms; NaN: no samples), read
    straight from the memo of arrow chunks where the rows were parsed before (what validation
    compares each row's ``time_ms`` with). Raises :class:`BadSamples` as :func:`parse_column`."""
    return _column(column, positions, medians=True)


def _column(column, positions: np.ndarray, medians: bool) -> np.ndarray:
    """:func:`parse_column`'s records (object array), or their medians (float64)."""
    import pyarrow as pa

    positions = np.asarray(positions, dtype=np.int64)
    arrow = getattr(column.array, "__arrow_array__", None)
    if arrow is None:
        got = _parse_positions(lambda at: column.iloc[at].to_numpy(dtype=object), positions)
        return np.fromiter((p.median for p in got), dtype=float, count=len(got)) if medians else _objects(got)
    data = arrow()
    chunks = data.chunks if isinstance(data, pa.ChunkedArray) else [data]
    ends = np.cumsum([len(c) for c in chunks])
    out = np.full(positions.size, np.nan) if medians else np.empty(positions.size, dtype=object)
    which = np.searchsorted(ends, positions, side="right")
    for c in np.unique(which).tolist():
        sel = np.flatnonzero(which == c)
        local = positions[sel] - (ends[c - 1] if c else 0)
        chunk = chunks[c]
        memo = _memo_rows(chunk)
        # the rows of this chunk parsed before are read from the memo
        got = local if memo is None else local[~memo[2][local]]
        if got.size:
            try:
                parsed = _parse_positions(lambda at: chunk.take(pa.array(at)).to_pylist(), got)
            except BadSamples as exc:   # the row's position in the column, not in the chunk
                raise BadSamples(exc.position + (int(ends[c - 1]) if c else 0), exc.reason) from None
            if memo is None:
                out[sel] = [p.median for p in parsed] if medians else _objects(parsed)
                continue
            memo[0][got] = _objects(parsed)
            memo[1][got] = [p.median for p in parsed]
            memo[2][got] = True
        out[sel] = memo[1][local] if medians else memo[0][local]
    return out


def _objects(items: list) -> np.ndarray:
    """``items`` as a 1-d object array (numpy never looks inside a record)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _parse_positions(texts_at, positions: np.ndarray) -> list[Parsed]:
    """:func:`parse` of the texts ``texts_at(at)`` gives for ``at``, a slice of ``positions`` of
    at most :data:`COLUMN_ROWS` rows at a time; :class:`BadSamples` names the first position whose
    text does not parse."""
    out: list = []
    for s in range(0, positions.size, COLUMN_ROWS):
        at = positions[s:s + COLUMN_ROWS]
        texts = texts_at(at)
        try:   # parse() reads a missing cell (None, NA, NaN) as no samples
            out += parse(texts)
        except (ValueError, TypeError) as exc:   # which row: the first text that does not parse
            for k, t in zip(at.tolist(), texts):
                try:
                    parse([t])
                except (ValueError, TypeError) as why:
                    raise BadSamples(k, why) from None
            raise BadSamples(int(at[0]), exc) from None
    return out


class BadSamples(ValueError):
    """A ``samples_ms`` cell that is not a JSON list of lists of numbers: ``position`` (the
    row's position in the column :func:`parse_column` read) and the parser's ``reason``."""

    def __init__(self, position: int, reason: Exception):
        self.position, self.reason = position, reason
        super().__init__(f"row {position}: samples_ms is not a JSON list of rounds of numbers "
                         f"({type(reason).__name__}: {reason})")


def _parse_many(texts: list[str]) -> list[Parsed]:
    """Parse distinct texts, in batches of about :data:`BATCH_CHARS`: pyarrow for those it takes,
    the JSON module for the rest."""
    out: list = []
    start, size = 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= BATCH_CHARS or i == len(texts) - 1:
            out += _parse_batch(texts[start:i + 1])
            start, size = i + 1, 0
    return out


def _parse_batch(texts: list[str]) -> list[Parsed]:
    arrays = _arrow_rounds(texts)
    if arrays is None:
        return [_parse_one(t) for t in texts]
    rows, ok = arrays
    parsed = iter(_from_arrays(*rows))
    return [next(parsed) if good else _parse_one(t) for t, good in zip(texts, ok)]


def _parse_one(text: str) -> Parsed:
    rounds = timing.rounds_from_json(text)
    return summarize(len(rounds), S.round_values(rounds))


def _arrow_rounds(texts: list[str]):
    """``((row_rounds, round_lengths, flat values), ok)`` from pyarrow for the texts it can
    take (``ok[i]``), or None when it takes none of them as a batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    arr = pa.array(texts, type=pa.large_string())
    # one JSON object per line: a text with a line break of its own would break the framing
    ok = ~np.asarray(pc.match_substring_regex(arr, r"[\r\n]").to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.any():
        return None
    if not ok.all():
        arr = arr.filter(pa.array(ok))
    wrap = (pa.scalar('{"s":', pa.large_string()), pa.scalar("}\n", pa.large_string()))
    lines = pc.binary_join_element_wise(wrap[0], arr, wrap[1], pa.scalar("", pa.large_string()))
    off = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    buf = lines.buffers()[2][int(off[0]):int(off[-1])]
    longest = int(np.diff(off).max())
    schema = pa.schema([("s", pa.list_(pa.list_(pa.float64())))])
    try:
        table = pj.read_json(pa.BufferReader(buf),
                             read_options=pj.ReadOptions(block_size=max(1 << 24, 2 * longest)),
                             parse_options=pj.ParseOptions(explicit_schema=schema,
                                                           unexpected_field_behavior="error"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    col = table.column("s").combine_chunks()
    inner = col.flatten()
    flat = inner.flatten()
    if col.null_count or inner.null_count or flat.null_count or len(col) != int(ok.sum()):
        return None  # a null where a list or number belongs: the JSON module says what is wrong
    row_rounds = np.diff(np.asarray(col.offsets)).astype(np.int64)
    round_len = np.diff(np.asarray(inner.offsets)).astype(np.int64)
    values = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=float)
    return (row_rounds, round_len, values), ok


def _from_arrays(row_rounds: np.ndarray, round_len: np.ndarray, flat: np.ndarray) -> list[Parsed]:
    """:class:`Parsed` records from the flattened samples of several rows: ``row_rounds[r]``
    rounds for row r (in order), ``round_len[k]`` calls for round k, ``flat`` every call time.
    The per-round medians are computed for all rounds of one length at once, the statistics by
    :func:`summarize_many`."""
    starts = np.cumsum(round_len) - round_len
    med = np.full(round_len.size, np.nan)
    for n in np.unique(round_len):
        k = np.flatnonzero(round_len == n)
        if n == 1:
            med[k] = flat[starts[k]]
        elif n > 1:
            med[k] = np.median(flat[starts[k][:, None] + np.arange(n)], axis=1)
    keep = round_len > 0                        # empty rounds are skipped, as round_values does
    counts = np.bincount(np.repeat(np.arange(row_rounds.size), row_rounds)[keep], minlength=row_rounds.size)
    return summarize_many(row_rounds, np.split(med[keep], np.cumsum(counts)[:-1]))


def summarize_many(rounds: Sequence[int], values: Sequence[np.ndarray]) -> list[Parsed]:
    """:func:`summarize` of many rows at once (``rounds[r]`` stored rounds and per-round medians
    ``values[r]`` each): the statistics of all rows with one number of values are computed as
    one array; a row with a non-finite value takes :func:`summarize` itself."""
    counts = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    finite = np.fromiter((np.isfinite(v).all() for v in values), dtype=bool, count=len(values))
    out: list = [None] * len(values)
    for r in np.flatnonzero(~finite | (counts == 0)).tolist():
        out[r] = summarize(rounds[r], values[r])
    for n in np.unique(counts[finite & (counts > 0)]):
        rows = np.flatnonzero(finite & (counts == n))
        v = np.stack([values[r] for r in rows.tolist()]).astype(float, copy=False)
        med, lo, hi, dr = _stats(v)
        for k, r in enumerate(rows.tolist()):
            out[r] = Parsed(int(rounds[r]), v[k], float(med[k]), float(lo[k]), float(hi[k]), float(dr[k]))
    return out


def _stats(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each row of ``v`` (m rows of n finite per-round medians, n >= 1): the median, the
    interval of :func:`flyexplore.measure.stats.median_ci` at :data:`SIDE_CONFIDENCE` and
    :func:`flyexplore.measure.stats.drift`, as four float arrays of length m."""
    m, n = v.shape
    med = np.median(v, axis=1)
    i, j = S.median_ci_ranks(n, SIDE_CONFIDENCE) if n >= 2 else (-1, n)
    if i >= 0 and j < n:
        srt = np.sort(v, axis=1)
        lo, hi = srt[:, i], srt[:, j]
    else:
        lo = hi = np.full(m, np.nan)
    dr = np.zeros(m)
    if n >= 2 * S.DRIFT_PARTS:   # the parts np.array_split makes, each part's median
        size = [len(c) for c in np.array_split(np.empty(n), S.DRIFT_PARTS)]
        ends = np.cumsum(size)
        parts = np.stack([np.median(v[:, e - k:e], axis=1) for e, k in zip(ends, size)], axis=1)
        pmin, pmax = parts.min(axis=1), parts.max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            dr = np.where(pmin > 0, pmax / pmin - 1.0, np.inf)
    return med, lo, hi, dr
