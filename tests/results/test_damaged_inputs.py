"""Damaged and foreign result files (issue 22): :func:`flyexplore.results.table.load` returns the
file's full rows or raises one :class:`UsageError` line naming the file and the problem -- never
another exception, never a torn CSV row read as data. Real files: written by ``save`` from
``frame`` rows, then cut, emptied or replaced by bytes that are no result file."""
import json
import subprocess

import pandas as pd
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from flyexplore.errors import UsageError
from flyexplore.results import table as R


def rows(n=6, run="r1"):
    """``n`` result rows of a CPU sweep; a message with a comma, a quote and a newline (a CSV field
    over two lines), and operator parameters as the last columns (the last CSV field is ``k``)."""
    out = []
    for i in range(n):
        out.append({"schema_version": R.SCHEMA_VERSION, "run_id": run, "op": "gemm",
                    "case": f"{8 * (i // 2 + 1)}x64x64", "dtype": "fp32",
                    "backend": ("aten", "inductor")[i % 2], "status": "ok", "source": "measured",
                    "time_ms": 0.05 + i / 97, "message": 'note, "quoted"\nsecond line' if i == 2 else None,
                    "platform": "cpu", "device": "cpu", "arch": "x86_64", "host": "h",
                    "samples_ms": json.dumps([[0.05, 0.051], [0.049]]),
                    "m": 8 * (i // 2 + 1), "n": 64, "k": 64})
    return out


def write(tmp, ext, df=None):
    p = tmp / f"r{ext}"
    R.save(R.frame(rows()) if df is None else df, p)
    return p


def one_line_error(path, needle, **kw):
    """``load(path)`` raises UsageError, one line, naming ``path``, containing ``needle``."""
    with pytest.raises(UsageError) as e:
        R.load(path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and needle in msg, msg
    return msg


def cells(df):
    """The frame's values as plain Python (NA as None), for comparing frames cell by cell."""
    return df.astype(object).where(df.notna(), None).values.tolist()


def is_prefix(got, full):
    """``got`` is the first rows of ``full``, every cell equal (in ``got``'s columns)."""
    cols = [c for c in got.columns if c in full.columns]
    return len(got) <= len(full) and cells(got[cols]) == cells(full[cols].iloc[:len(got)])


# ---- one kind of damage each --------------------------------------------------------------------

def _bytes_of(tmp, ext):
    return write(tmp, ext).read_bytes()


def _line(i, edit):
    """Damage: line ``i`` (0-based) of the file replaced by ``edit(line)``."""
    def damage(b):
        lines = b.split(b"\n")
        lines[i] = edit(lines[i])
        return b"\n".join(lines)
    return damage


DAMAGE = {
    # name: (extension, how the bytes are made from a valid file's, what the message says)
    "parquet cut short": (".parquet", lambda b: b[: len(b) // 2], "not a readable Parquet file"),
    "parquet empty": (".parquet", lambda b: b"", "is empty (0 bytes)"),
    "parquet garbage": (".parquet", lambda b: bytes(range(256)) * 8, "not a readable Parquet file"),
    "csv named .parquet": (".parquet", lambda b: b"op,case,dtype,backend,status\n", "not a readable Parquet file"),
    "csv empty": (".csv", lambda b: b"", "is empty (0 bytes)"),
    "csv blank lines": (".csv", lambda b: b"\n\n", "holds no header row"),
    "csv foreign table": (".csv", lambda b: b"a,b\n1,2\n", ("not a flyexplore result file: missing columns op, "
                                                            "case, dtype, backend, status (its columns: a, b)")),
    "csv last row cut": (".csv", lambda b: b[: b.rindex(b"x86_64") + 5], "the last row is cut short"),
    "csv quote never closed": (".csv", lambda b: b + b'x,"open\n', "not a readable CSV file"),
    "csv cut after a newline inside a quoted field": (".csv", lambda b: b[: b.index(b"\nsecond line") + 1],
                                                      "EOF inside string"),
    "csv first row too long": (".csv", _line(1, lambda x: x + b",extra"), "a row has more fields than the header"),
    "csv later row too long": (".csv", _line(2, lambda x: x + b",extra"), "Expected"),
    "csv not utf-8": (".csv", lambda b: b"\xff\xfe" + b, "not UTF-8 text"),
    "jsonl bad middle line": (".jsonl", _line(2, lambda x: b"{not json"), "line 3 is not valid JSON"),
    "jsonl last line cut": (".jsonl", lambda b: b[:-20], "line 6 is cut short"),
    "jsonl array line": (".jsonl", _line(0, lambda x: b"[1, 2]"), "line 1 is not a JSON object"),
    "jsonl not utf-8": (".jsonl", lambda b: b + b"\xff\n", "not UTF-8 text"),
    "jsonl foreign rows": (".jsonl", lambda b: b'{"a": 1}\n', "missing columns op, case, dtype, backend, status"),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_damaged_file_is_one_line_naming_it(tmp_path, name):
    ext, damage, needle = DAMAGE[name]
    good = _bytes_of(tmp_path, ext)
    bad = tmp_path / f"bad{ext}"
    bad.write_bytes(damage(good))
    one_line_error(bad, needle)


def test_csv_whose_last_row_was_cut_in_arch_names_its_line(tmp_path):
    """The trial's case: a cut inside the last row's ``x86_64`` was read as a second environment
    with arch ``x86_6``; now the line of the torn row is named."""
    p = write(tmp_path, ".csv")
    data = p.read_bytes()
    p.write_bytes(data[: data.rindex(b"x86_64") + 5])
    lines = p.read_bytes().count(b"\n") + 1
    one_line_error(p, f"line {lines}: the last row is cut short")


def test_csv_cut_inside_its_last_field_is_refused(tmp_path):
    """A cut within the last field leaves every field of the row there (``k`` = 6 of 64): only the
    missing newline tells, and it is enough."""
    p = write(tmp_path, ".csv")
    data = p.read_bytes()
    assert data.endswith(b",64\n")
    p.write_bytes(data[:-2])
    one_line_error(p, "the last row is cut short")


def test_folder_and_missing_file(tmp_path):
    (tmp_path / "d.csv").mkdir()
    one_line_error(tmp_path / "d.csv", "is a folder, not a result file")
    one_line_error(tmp_path / "none.parquet", "result file not found")


def test_newer_schema_names_the_file(tmp_path):
    df = R.frame(rows())
    df["schema_version"] = R.SCHEMA_VERSION + 1
    p = tmp_path / "new.jsonl"
    R.write_jsonl(df, p)
    one_line_error(p, "newer than this flyexplore understands")


def test_core_column_that_cannot_take_its_type(tmp_path):
    df = pd.DataFrame(rows())
    df["n_samples"] = 1.5   # Int64: 1.5 is no integer
    p = tmp_path / "r.csv"
    df.to_csv(p, index=False)
    one_line_error(p, "a core column cannot take its type")


def test_empty_result_sets_load_as_no_rows(tmp_path):
    """What ``save`` writes for no rows loads back as no rows: a header-only CSV, an empty JSONL
    (one line per row, none), a Parquet file without rows."""
    for ext in R.FORMATS:
        p = R.save(R.empty_frame(), tmp_path / f"e{ext}")
        back = R.load(p, validated=True)
        assert len(back) == 0 and list(back.columns[: len(R.COLUMNS)]) == list(R.COLUMNS), ext


# ---- validation: what saving checks, report and compare check too -------------------------------

def test_validated_load_refuses_duplicate_rows_of_one_run(tmp_path):
    """``--shapes "64x64x64;64x64x64"`` gave two rows for one key in one run."""
    dup = rows(2)
    dup[1]["backend"] = "aten"
    for ext in R.FORMATS:
        p = R.save(R.frame(dup), tmp_path / f"d{ext}")
        assert len(R.load(p)) == 2   # still readable as data
        one_line_error(p, "is not a valid result file: duplicate rows for ['gemm', '8x64x64', 'fp32', 'aten']",
                       validated=True)


def test_validated_load_refuses_an_unknown_status(tmp_path):
    r = rows(1)
    r[0]["status"] = "great"
    p = R.save(R.frame(r), tmp_path / "s.parquet")
    one_line_error(p, "unknown status ['great']", validated=True)


def test_load_set_refuses_one_run_twice(tmp_path):
    p = write(tmp_path, ".parquet")
    assert len(R.load_set([p])) == 6
    with pytest.raises(UsageError, match="hold the same rows of one run"):
        R.load_set([p, p])
    other = R.save(R.frame(rows(run="r2")), tmp_path / "r2.csv")
    assert len(R.load_set([p, other])) == 12


def test_check_backends_lists_what_is_there():
    df = R.frame(rows())
    R.check_backends(df, "aten")
    R.check_backends(df, ["aten", "inductor"])
    with pytest.raises(UsageError, match=r"unknown baseline 'cublas': not a backend in the rows "
                                         r"\(backends present: aten, inductor\)"):
        R.check_backends(df, ["aten", "cublas"])
    R.check_backends(R.empty_frame(), "anything")   # no rows: nothing to compare


# ---- cut at any byte ----------------------------------------------------------------------------

def _cut_check(path, full, data, at):
    path.write_bytes(data[:at])
    try:
        got = R.load(path)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return None
    assert is_prefix(got, full), (at, len(data))
    return got


_SOURCES: dict = {}


def _source(tmp_path_factory, ext):
    """A valid file of :func:`rows` (made once per format), its full frame and its bytes."""
    if ext not in _SOURCES:
        src = write(tmp_path_factory.mktemp("src"), ext)
        _SOURCES[ext] = (src.parent, R.load(src), src.read_bytes())
    return _SOURCES[ext]


@pytest.mark.parametrize("ext", R.FORMATS)
@settings(max_examples=40, deadline=None)
@given(frac=st.floats(0, 1), at_line_end=st.booleans())
def test_a_file_cut_anywhere_loads_whole_or_is_refused(tmp_path_factory, ext, frac, at_line_end):
    """Truncated at a random byte (or just after the next newline, where a cut leaves whole
    lines -- also inside the message that spans two lines): the full rows, or a UsageError; fewer
    rows only where the cut fell at a row's end (a valid file of fewer rows), each row whole."""
    tmp, full, data = _source(tmp_path_factory, ext)
    at = round(frac * len(data))
    if at_line_end and data.find(b"\n", at) >= 0:
        at = data.find(b"\n", at) + 1
    got = _cut_check(tmp / f"cut{ext}", full, data, at)
    if got is not None and len(got) < len(full):
        assert ext != ".parquet" and (at == 0 or data[:at].endswith(b"\n")), at
    if at == len(data):
        assert got is not None and len(got) == len(full)


def test_every_cut_of_a_csv_near_its_end_is_caught(tmp_path):
    """Each of the last 200 byte positions (the last row and a half): whole, or refused."""
    src = write(tmp_path, ".csv")
    full, data = R.load(src), src.read_bytes()
    kept = [at for at in range(len(data) - 200, len(data) + 1)
            if _cut_check(tmp_path / "cut.csv", full, data, at) is not None]
    ends = [at for at in kept if at < len(data)]
    assert all(data[:at].endswith(b"\n") for at in ends) and len(data) in kept


@settings(max_examples=40, deadline=None)
@given(line=st.integers(0, 5), junk=st.sampled_from(["{", "not json", "[1, 2]", '{"op": ', "null", '"x"']))
def test_a_bad_jsonl_line_is_named(tmp_path_factory, line, junk):
    tmp, _, data = _source(tmp_path_factory, ".jsonl")
    lines = data.decode().splitlines(keepends=True)
    lines[line] = junk + "\n"
    p = tmp / "bad.jsonl"
    p.write_text("".join(lines))
    one_line_error(p, f"line {line + 1} is not")


# ---- the committed files ------------------------------------------------------------------------

def test_every_committed_table_loads_or_is_refused_in_one_line():
    """Every .parquet/.csv/.jsonl under data/ is read whole, or refused as not a result file
    (the coverage tables, published figures and report tables there are other tables) --
    never another exception. Most committed result files also pass validation."""
    files = subprocess.run(["git", "ls-files", "data"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    files = [f for f in files if f.endswith(R.FORMATS)]
    loaded = refused = valid = 0
    for f in files:
        try:
            df = R.load(ROOT / f)
        except UsageError as exc:
            assert "\n" not in str(exc) and f in str(exc), exc
            refused += 1
            continue
        loaded += 1
        try:
            R.load(ROOT / f, validated=True)
            valid += 1
        except UsageError as exc:
            assert "is not a valid result file" in str(exc), exc
        assert len(df) and df["op"].notna().any(), f
    assert loaded >= 20 and refused >= 10 and valid >= 20, (loaded, refused, valid)
