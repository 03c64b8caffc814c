"""`grrm score`'s arguments: refused with exit 2 and the option's name, before anything is sent or written."""

from __future__ import annotations

from grrm_cli.main import main


def test_a_bad_tenant_name_is_refused_before_anything_is_sent(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"source": "a", "candidates": ["x", "y"], "src_lang": "en", "trg_lang": "de"}\n')
    assert main(["score", str(source), "-o", str(tmp_path / "out"), "--url", "http://127.0.0.1:9",
                 "--tenant", "two words"]) == 2
    error = capsys.readouterr().err
    assert "--tenant" in error and "two words" in error
    assert not (tmp_path / "out").exists()


def test_finish_within_needs_a_positive_time_and_a_service_pool(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"source": "a", "candidates": ["x", "y"], "src_lang": "en", "trg_lang": "de"}\n')
    config = tmp_path / "app.yaml"
    config.write_text("applications: []\n")
    for where, seconds, problem in ((["--url", "http://127.0.0.1:9"], "0", "above 0"),
                                    (["--config", str(config)], "60", "--url or --app")):
        assert main(["score", str(source), "-o", str(tmp_path / "out.jsonl"), *where, "--finish-within-s", seconds]) == 2
        error = capsys.readouterr().err
        assert "--finish-within-s" in error and problem in error, error
    assert not (tmp_path / "out.jsonl").exists()


def test_a_config_whose_model_is_nowhere_is_refused_before_its_engine_starts(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"source": "a", "candidates": ["x", "y"], "src_lang": "en", "trg_lang": "de"}\n')
    config = tmp_path / "app.yaml"
    config.write_text("applications:\n  - name: grrm\n    import_path: deployments.app:build_app\n    args:\n"
                      "      engine: {kind: transformers, model: /no/such/grrm}\n")
    status = main(["score", str(source), "-o", str(tmp_path / "out.jsonl"), "--config", str(config)])
    error = capsys.readouterr().err
    assert status != 0 and "engine.model: '/no/such/grrm' is not a directory" in error, error


def test_a_trace_is_recorded_only_by_one_client_of_a_service(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"source": "a", "candidates": ["x", "y"], "src_lang": "en", "trg_lang": "de"}\n')
    config = tmp_path / "app.yaml"
    config.write_text("applications: []\n")
    for where in (["--config", str(config)], ["--app", "grrm", "--ray"]):
        assert main(["score", str(source), "-o", str(tmp_path / "out"), *where, "--trace", str(tmp_path / "t.json")]) == 2
        error = capsys.readouterr().err
        assert "--trace" in error and "--url or --app" in error, error
    assert not (tmp_path / "t.json").exists()
