from flyexplore import results as R


def test_demo_writes_results_env_and_report(cli, tmp_path):
    out = tmp_path / "demo"
    p = cli("demo", "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    assert "report:" in p.stdout
    df = R.load(out / "results.parquet")
    R.validate(df)
    assert set(df.op) == {"gemm", "rmsnorm", "topk"}
    assert set(df[df.status == "ok"].backend) >= {"aten", "inductor"}
    un = df[df.status == "unavailable"]
    assert len(un) and un.message.notna().all()
    assert (df.status != "error").all(), df[df.status == "error"][["op", "case", "backend", "message"]]
    html = (out / "report.html").read_text()
    assert "Plotly.newPlot" in html and "speedup" in html.lower()
    assert "platform: cpu" in html
    assert (out / "env.json").exists() and (out / "results.csv").exists()
