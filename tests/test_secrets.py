"""Secrets in storage URLs and DSNs (issue #52, item 2): whatever form a password takes in ``--storage`` (user
information, ``?password=``, another secret query key, percent-encoded, a libpq keyword DSN), no command prints it
or writes it to a file. The URLs point at a port nothing listens on, so every command is refused fast."""
from __future__ import annotations

from pathlib import Path

import pytest

from lightning_tfm.base.redact import mask_url, scrub, scrub_text

from pg import pg_url, postgres  # noqa: F401  (fixtures)

SMOKE_SWEEP = "sweeps/smoke.yaml"
EXPERIMENT = "experiments/multi30k-smoke.yaml"
SECRET = "SECRETPW"
#: every form a password (or token) may take in a storage URL or DSN; the secret is SECRETPW in each, written
#: plainly or percent-encoded (a driver or a message may quote it decoded)
FORMS = {
    "query": f"postgresql://ltfm@127.0.0.1:1/db?password={SECRET}",
    "query-second": f"postgresql://ltfm@127.0.0.1:1/db?connect_timeout=3&password={SECRET}",
    "userinfo": f"postgresql://ltfm:{SECRET}@127.0.0.1:1/db",
    "sslpassword": f"postgresql://ltfm@127.0.0.1:1/db?sslmode=disable&sslpassword={SECRET}",
    "encoded-key": "postgresql://ltfm@127.0.0.1:1/db?pass%77ord=SECRET%50W",
    "encoded-value": "postgresql://ltfm@127.0.0.1:1/db?password=SECR%45TPW",
    "token": f"postgresql://ltfm@127.0.0.1:1/db?token={SECRET}&api_key={SECRET}",
    "keyword-dsn": f"host=127.0.0.1 port=1 dbname=db password={SECRET}",
    "keyword-dsn-quoted": f"host=127.0.0.1 port=1 password = '{SECRET} x\\'y' dbname=db",
}
SPELLINGS = (SECRET, "SECRET%50W", "SECR%45TPW")


def leaked(text: str) -> list[str]:
    return [s for s in SPELLINGS if s in text]


def files_holding_secret(root: Path) -> list[str]:
    """Every file under ``root`` whose name or bytes hold the secret in any spelling."""
    found = []
    for path in root.rglob("*"):
        if any(s in path.name for s in SPELLINGS):
            found.append(str(path))
        elif path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(s.encode() in data for s in SPELLINGS):
                found.append(str(path))
    return found


@pytest.mark.parametrize("form", FORMS)
def test_mask_url_masks_every_form(form):
    url = FORMS[form]
    shown = mask_url(url)
    assert not leaked(shown) and "***" in shown, shown
    assert not leaked(scrub({"sweep": {"storage": url}})["sweep"]["storage"])
    password = "SECRETPW x'y" if form == "keyword-dsn-quoted" else SECRET  # as the driver reads it
    message = scrub_text(f"cannot connect with {url}: the password {password} was refused", url)
    assert not leaked(message) and "x'y" not in message, message
    # what is not secret stays readable
    assert "127.0.0.1" in shown


def test_what_is_not_a_secret_is_shown_as_it_is():
    for url in ("sqlite:////tmp/results/smoke.db",
                "postgresql://ltfm@h:5432/db?sslmode=require&passfile=/home/u/.pgpass",
                "postgresql://ltfm@h/db?application_name=ltfm&keepalives=1"):
        assert mask_url(url) == url
    assert scrub_text("train.batch_tokens=4096 decode.max_len_b=5 passwordless=1") == \
        "train.batch_tokens=4096 decode.max_len_b=5 passwordless=1"


def commands(url: str, data_dir: Path, tmp: Path) -> dict[str, list[str]]:
    results = tmp / "results"
    results.mkdir(exist_ok=True)
    return {
        "sweep": ["sweep", SMOKE_SWEEP, "--storage", url, f"data.path={data_dir}", f"run.results_dir={results}"],
        "sweep --status": ["sweep", SMOKE_SWEEP, "--status", "--storage", url, f"data.path={data_dir}",
                           f"run.results_dir={results}"],
        "report": ["report", SMOKE_SWEEP, "--storage", url, "--results", results, "--out", tmp / "report"],
    }


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("command", ["sweep", "sweep --status", "report"])
def test_no_command_shows_or_writes_the_password(form, command, data_dir, tmp_path, ltfm_here):
    p = ltfm_here(*commands(FORMS[form], data_dir, tmp_path)[command])
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ltfm: error: ") and "storage" in lines[0], p.stderr
    assert "***" in lines[0], lines[0]  # the URL is named, masked
    assert not leaked(p.stdout + p.stderr), p.stderr
    assert files_holding_secret(tmp_path) == []


def test_config_and_saved_settings_mask_the_password(data_dir, ltfm_here):
    for url in FORMS.values():
        p = ltfm_here("config", EXPERIMENT, f"sweep.storage={url}", f"data.path={data_dir}")
        assert p.returncode == 0, p.stderr
        assert "storage:" in p.stdout and not leaked(p.stdout + p.stderr), p.stdout


@pytest.mark.parametrize("base", [f"http://ltfm:{SECRET}@127.0.0.1:9", f"http://127.0.0.1:9/?api_key={SECRET}"])
def test_the_wandb_server_is_named_without_its_credentials(base, tmp_path, ltfm_here):
    """``--from-wandb`` with a WANDB_BASE_URL holding credentials, unreachable: one line naming the server masked;
    neither the URL's secret nor the API key shown."""
    key = "k" * 12 + SECRET + "k" * 20
    env = {"WANDB_API_KEY": key, "WANDB_BASE_URL": base, "HOME": str(tmp_path), "NETRC": str(tmp_path / "netrc")}
    p = ltfm_here("report", SMOKE_SWEEP, "--from-wandb", "team/proj", "--out", tmp_path / "report", env=env)
    assert p.returncode == 2 and "cannot reach W&B at http://" in p.stderr and "***" in p.stderr, p.stderr
    assert not leaked(p.stdout + p.stderr), p.stderr
    assert files_holding_secret(tmp_path) == []


@pytest.mark.long  # make test-long: what it checks is exercised in make test without a server by
# test_no_command_shows_or_writes_the_password (output) and test_config_and_saved_settings_mask_the_password (files)
def test_a_sweep_on_postgres_with_the_password_in_the_query_writes_it_nowhere(postgres, pg_url,  # noqa: F811
                                                                              tmp_path, data_dir):
    """The whole way through a real server: a sweep (its trial's config, summary, logs and offline W&B run), its
    --status and its report (whose optuna-dashboard line names the storage) with ``?password=`` in the URL."""
    from conftest import ltfm, write_sweep

    password = postgres.password
    url = pg_url.replace(f":{password}@", "@") + f"?password={password}"
    assert password in url and f":{password}@" not in url
    results, wandb_dir = tmp_path / "results", tmp_path / "wandb"
    sweep = write_sweep(tmp_path / "secret.yaml", "secret", {"base": {}})
    common = [f"data.path={data_dir}", f"run.results_dir={results}", "--storage", url]
    env = {"WANDB_DIR": str(wandb_dir), "WANDB_MODE": "offline"}
    outputs = []
    for args in (["sweep", sweep, *common], ["sweep", sweep, *common, "--status"],
                 ["report", sweep, "--storage", url, "--results", results, "--out", tmp_path / "report"]):
        p = ltfm(*args, env=env)
        assert p.returncode == 0, (args[0], p.stdout[-2000:], p.stderr[-3000:])
        outputs.append(p.stdout + p.stderr)
    md = (tmp_path / "report" / "table3.md").read_text()
    dashboard = [ln for ln in md.splitlines() if "optuna-dashboard '" in ln]
    assert dashboard and "?password=***'" in dashboard[0], dashboard  # the command to open the study, masked
    assert [o for o in outputs if password in o] == []
    assert any(results.rglob("summary.json")) and any(tmp_path.rglob("*.wandb"))
    assert [f for f in tmp_path.rglob("*") if f.is_file() and password.encode() in f.read_bytes()] == []


@pytest.mark.parametrize("form", ["query", "userinfo", "keyword-dsn"])
def test_an_argument_error_quoting_a_url_masks_it(form, ltfm_here):
    """argparse quotes what it does not know: a mistyped ``--storge URL`` is said back masked."""
    p = ltfm_here("sweep", SMOKE_SWEEP, "--storge", FORMS[form])
    assert p.returncode == 2 and "unrecognized arguments: --storge" in p.stderr, p.stderr
    assert not leaked(p.stdout + p.stderr), p.stderr
    assert "***" in p.stderr or "=" in FORMS[form], p.stderr  # (a word with "=" is taken for an override)
