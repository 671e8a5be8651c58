from pathlib import Path

import pytest

from tenants.errors import ConfigError
from tenants.loader import Tenant, load_tenants, parse_tenants

GOOD = """\
# production tenants
[tenant acme]
rpm = 600
models = llm-large, llm-small

[tenant globex]
rpm = 60
models = llm-small
"""


def error_for(text: str, path: str = "tenants.conf") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_tenants(text, path)
    return info.value


def test_valid_config_still_parses() -> None:
    assert parse_tenants(GOOD) == [
        Tenant("acme", 600, ("llm-large", "llm-small")),
        Tenant("globex", 60, ("llm-small",)),
    ]


def test_config_error_formatting() -> None:
    err = ConfigError("bad thing", "a.conf", 3)
    assert (err.message, err.path, err.line) == ("bad thing", "a.conf", 3)
    assert str(err) == "a.conf:3: bad thing"
    assert str(ConfigError("bad thing")) == "bad thing"
    assert ConfigError("bad thing").path is None
    assert ConfigError("bad thing").line is None
    assert isinstance(err, ValueError)


def test_bad_value_points_at_its_line() -> None:
    err = error_for(GOOD.replace("rpm = 60\n", "rpm = sixty\n"))
    assert (err.path, err.line) == ("tenants.conf", 7)
    assert str(err) == "tenants.conf:7: tenant 'globex': rpm must be a positive integer"
    err = error_for(GOOD.replace("llm-large, llm-small", "llm-large,,"))
    assert err.line == 4
    assert err.message == "tenant 'acme': models must be a comma-separated list"


def test_syntax_errors_point_at_their_line() -> None:
    err = error_for("rpm = 5\n")
    assert (err.line, err.message) == (1, "setting outside a [tenant NAME] section")
    err = error_for(GOOD + "\nburst = 10\n")
    assert err.line == 10
    assert err.message == "tenant 'globex': unknown setting 'burst'"
    err = error_for(GOOD.replace("rpm = 600\n", "rpm 600\n"))
    assert err.line == 3
    err = error_for(GOOD + "rpm = 5\n")
    assert (err.line, err.message) == (9, "tenant 'globex': 'rpm' set twice")


def test_missing_setting_and_duplicate_tenant_point_at_headers() -> None:
    err = error_for(GOOD.replace("models = llm-small\n", ""))
    assert (err.line, err.message) == (6, "tenant 'globex': missing setting 'models'")
    err = error_for(GOOD + "# again\n[tenant acme]\nrpm = 1\nmodels = x\n")
    assert (err.line, err.message) == (10, "duplicate tenant 'acme'")


def test_default_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_tenants("[tenant a]\nrpm = 0\nmodels = m\n")
    assert str(info.value) == "<string>:2: tenant 'a': rpm must be a positive integer"


def test_load_tenants_uses_the_file_path(tmp_path: Path) -> None:
    good = tmp_path / "good.conf"
    good.write_text(GOOD, encoding="utf-8")
    assert [t.name for t in load_tenants(good)] == ["acme", "globex"]
    bad = tmp_path / "bad.conf"
    bad.write_text("[tenant a]\nmodels = m\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_tenants(bad)
    assert str(info.value) == f"{bad}:1: tenant 'a': missing setting 'rpm'"
