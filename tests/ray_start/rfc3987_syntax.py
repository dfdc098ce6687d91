# Test-only stand-in put first on PYTHONPATH of the local Ray instance in tests/run/conftest.py.
# Every Ray helper process imports jsonschema, which imports rfc3987_syntax when it is installed
# (it is, through jupyter): building its grammar takes ~3 s of CPU per process. Ray's raylet
# gives its Python agents ~15 s to start, and on a 2-core machine five of them importing at once
# miss that. jsonschema treats a missing rfc3987_syntax as optional (no "iri" format check).
raise ImportError("rfc3987_syntax left out of the test's Ray processes (see tests/ray_start)")
