"""serving/options.py: `ServerOptions` checks ports and model names, as `serve` and
`export` do."""


import pytest

from tfrs_logq.serving.server import ServerOptions


@pytest.mark.parametrize("field,value", [("port", 70000), ("rest_api_port", -1),
                                         ("port", 65536)])
def test_ports_are_checked_to_0_65535(field, value):
    with pytest.raises(ValueError, match=f"--{field} {value} is not a port: give 0 to 65535"):
        ServerOptions(model_name="m", model_base_path="/nowhere", **{field: value})


def test_serve_refuses_a_port_out_of_range_and_a_bad_model_name_in_one_line(capsys, tmp_path):
    """`serve --port 70000` ended in an OverflowError traceback; `--model_name a/b` was
    served although `export` refuses it."""
    from tfrs_logq import cli

    for flags, words in [(["--model_name", "m", "--port", "70000"], ["--port 70000", "65535"]),
                         (["--model_name", "a/b"], ["--model_name 'a/b'", "not a valid"])]:
        code = cli.main(["serve", "--model_base_path", str(tmp_path / "missing"), *flags])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        for word in words:
            assert word in err, err


def test_serve_and_export_refuse_the_same_model_names():
    from tfrs_logq.serving.export import check_model_name

    for name in ["a/b", "..", ".hidden", "-x", "", "a" * 200, "ok.name_1-2"]:
        try:
            check_model_name(name)
            export_ok = True
        except ValueError:
            export_ok = False
        try:
            ServerOptions(model_name=name, model_base_path="/nowhere")
            serve_ok = True
        except ValueError:
            serve_ok = False
        assert serve_ok == export_ok, name
