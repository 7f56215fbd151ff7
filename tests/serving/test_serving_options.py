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
        try:  # refused while the flags are parsed (SystemExit 2) or when run (returns 2)
            code = cli.main(["serve", "--model_base_path", str(tmp_path / "missing"), *flags])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        for word in words:
            assert word in err, err


# TF Serving's servable names, the rule `export` and `serve` both apply: one path component
# of letters, digits, '.', '_' and '-', not starting with '.' or '-', no '..', at most 128.
REFUSED_NAMES = ["a/b", "../../x", "..", "a..b", ".hidden", "-x", "", "a" * 129, "é", "a b"]
ACCEPTED_NAMES = ["m", "ok.name_1-2", "ml-1m_v2.0", "9", "a" * 128]


@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_serve_and_export_refuse_a_bad_model_name(name):
    from tfrs_logq.serving.export import check_model_name

    with pytest.raises(ValueError, match="is not a valid servable name"):
        check_model_name(name)
    with pytest.raises(ValueError, match="is not a valid servable name"):
        ServerOptions(model_name=name, model_base_path="/nowhere")


@pytest.mark.parametrize("name", ACCEPTED_NAMES)
def test_serve_and_export_accept_a_good_model_name(name):
    from tfrs_logq.serving.export import check_model_name

    assert check_model_name(name) == name
    assert ServerOptions(model_name=name, model_base_path="/nowhere").model_name == name
