"""Adversarial configs and feature folders: each one line ``error: ...``, exit 2, no row written, no checkpoint.

The kinds a clumsy user or an attacker produces beyond tests/test_bad_configs.py and test_bad_feature_folders.py:
a folder, a FIFO or a device given as the config, binary or non-UTF-8 text, TOML nested thousands deep, NUL
characters, names longer than a database column, numbers that only overflow once training has begun, an open-set
dataset the model cannot take; step files that are FIFOs, links to /dev/zero or hold a member twice, experiment
names PostgreSQL refuses. The database is compared row by row before and after, on SQLite and (a subset) PostgreSQL.
"""
import os
import signal

import numpy as np
import pytest

from engine.cli import main
from storage import get_engine, init_db
from support.bad_configs import BASE, _counts, _toml, _with
from support.bad_feature_folders import _good, _raw_members, raw, steps

DEEP_ARRAY = "a = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_TABLE = "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n"


def _nul(data: dict) -> str:
    return _toml(data).replace("\x00", "\\u0000")  # TOML spells a NUL character as an escape


CONFIGS = {  # id -> (how the config path is made, its content, substring of the one error line)
    "a folder": ("dir", None, "is a folder, not a config file"),
    "a FIFO (never opened for a blocking read)": ("fifo", None, "is a FIFO, not a config file"),
    "a link to /dev/zero": ("link", "/dev/zero", "is a device or socket, not a config file"),
    "binary garbage": ("bytes", bytes(range(256)) * 4, "not UTF-8 text (byte 128)"),
    "Latin-1 text": ("bytes", 'name = "caf\xe9"\n'.encode("latin-1"), "not UTF-8 text (byte 11)"),
    "UTF-16 text": ("bytes", _toml(BASE).encode("utf-16"), "not UTF-8 text (byte 0)"),
    "2 MB of comments": ("bytes", b"#" * (2 << 20) + b"\n" + _toml(BASE).encode(), "larger than 1048576 bytes"),
    "arrays nested 5000 deep": ("text", DEEP_ARRAY + _toml(BASE), "nested too deeply"),
    "inline tables nested 3000 deep": ("text", DEEP_TABLE + _toml(BASE), "nested too deeply"),
    "NUL in the name": ("text", _nul(_with(name="a\x00b")), "config key name must be 1..160 printable characters"),
    "NUL in dataset.root": ("text", _nul(_with(dataset__root="da\x00ta")), "config key dataset.root contains a NUL"),
    "NUL in a hyper-parameter key": ("text", _toml(BASE) + '[method_params.independent]\n"a\\u0000" = 1\n',
                                     "method_params.independent.'a\\x00' contains a NUL character"),
    "name of 250 characters": ("text", _toml(_with(name="n" * 250)), "config key name must be 1..160 printable characters"),
    "name with an escape sequence": ("text", _toml(_with(name="a\\u001b[31mb")), "config key name must be 1..160 printable characters"),
    "shapes with a billion classes": ("text", _toml(_with(dataset__name="shapes", scenario__initial_classes=10**9,
                                                          scenario__increment=0, scenario__num_steps=1)),
                                      "scenario.initial_classes must be a finite number in [1, 100000]"),
    "shapes with 8 million images": ("text", _toml(_with(dataset__name="shapes", dataset__num_classes=100_000,
                                                         scenario__initial_classes=50_000, scenario__increment=50_000)),
                                     "asks dataset shapes for 8000000 images"),
    "lr 1e300 (overflowed float32 in the optimizer)": ("text", _toml(_with(training__lr=1e300)), "training.lr must be"),
    "weight_decay 1e300": ("text", _toml(_with(training__weight_decay=1e300)), "training.weight_decay must be"),
    "lr_gamma 1e300": ("text", _toml(_with(training__lr_schedule="step", training__lr_milestones=[1],
                                           training__lr_gamma=1e300)), "training.lr_gamma must be"),
    "bct lam 1e308 (loss inf after the first step)": ("text", _toml(_with(methods=["bct"], method_params={"bct": {"lam": 1e308}})),
                                                      "method_params.bct.lam must be at most 1e+06"),
    "psp temperature 1e-300 (loss NaN)": ("text", _toml(_with(methods=["psp"], method_params={"psp": {"temperature": 1e-300}})),
                                          "method_params.psp.temperature must be at least 0.001"),
    "map@10^20 (int overflow while evaluating)": ("text", _toml(_with(eval__metrics=["map@100000000000000000000"])),
                                                  "1 <= K <= 1,000,000"),
    "replay of 10^18 per class": ("text", _toml(_with(scenario__training="finetune", scenario__replay_per_class=10**18)),
                                  "scenario.replay_per_class must be"),
    "open-set images with 3 channels for a 1-channel model": (
        "text", _toml(_with(eval__protocol="open-set", eval__open_set_dataset="shapes")),
        "the open-set query images have 3 channel(s) but the training images (digits) have 1"),
}
PG_CONFIGS = ["NUL in the name", "NUL in dataset.root", "NUL in a hyper-parameter key", "name of 250 characters",
              "a folder", "bct lam 1e308 (loss inf after the first step)"]


def _make_config(path, kind, content):
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(content)
    elif kind == "bytes":
        path.write_bytes(content)
    else:
        path.write_text(content)


@pytest.fixture
def no_hang():
    """A FIFO or device read would block forever: fail the test after 60 s instead."""
    def hung(*_):
        raise TimeoutError("the command blocked on its input")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _refused_in_one_line(argv, url, message, capsys, untouched=()):
    db = get_engine(url)
    init_db(db)
    before = _counts(db)
    capsys.readouterr()
    code = main([*argv, "--db", url])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert _counts(db) == before
    for path in untouched:
        assert not path.exists()


def _run_config(case, url, tmp_path, capsys):
    kind, content, message = CONFIGS[case]
    path = tmp_path / "c.toml"
    _make_config(path, kind, content)
    ck = tmp_path / "ck"
    _refused_in_one_line(["run", str(path), "--quiet", "--checkpoints", str(ck)], url, message, capsys, untouched=[ck])


@pytest.fixture
def pg_url(pg_server):
    """A new, empty PostgreSQL database, dropped after the test."""
    url = pg_server.create_database()
    yield url
    get_engine(url).dispose()
    pg_server.drop_database(url)


@pytest.mark.parametrize("case", list(CONFIGS))
def test_adversarial_config_is_one_line_exit_2_nothing_written(case, tmp_path, capsys, no_hang):
    _run_config(case, f"sqlite:///{tmp_path / 'c.db'}", tmp_path, capsys)


@pytest.mark.parametrize("case", PG_CONFIGS)
def test_adversarial_config_on_postgresql(case, pg_url, tmp_path, capsys, no_hang):
    _run_config(case, pg_url, tmp_path, capsys)


def _zip_twice(path):
    import zipfile
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": the point of the case
        for name, data in _raw_members().items():
            zf.writestr(name, data)
        zf.writestr("query_features.npy", _raw_members()["gallery_features.npy"])


def _many_steps(folder):
    for t in range(1, 202):
        np.savez(folder / f"step_{t}.npz", **_good(t))


FOLDERS = {  # id -> (builder, extra argv, substring of the one error line)
    "a step file that is a FIFO": (raw("step_2.npz", os.mkfifo), [], "step_2.npz is a FIFO, not a regular file, so it is not read"),
    "a step file that links to /dev/zero": (raw("step_2.npz", lambda p: p.symlink_to("/dev/zero")), [], "is a character device, not a regular file"),
    "a step file that is a folder": (raw("step_2.npz", lambda p: p.mkdir()), [], "is a folder, not a regular file"),
    "a member stored twice": (raw("step_2.npz", _zip_twice), [], "holds a member name twice (query_features.npy)"),
    "201 steps": (_many_steps, [], "201 step files; at most 200"),
    "--name with NUL": (steps({}), ["--name", "a\x00b"], "--name must be 1..200 printable characters"),
    "--name of 201 characters": (steps({}), ["--name", "n" * 201], "--name must be 1..200 printable characters"),
    "--name with an escape sequence": (steps({}), ["--name", "a\x1b[31mb"], "--name must be 1..200 printable characters"),
    "--name with a bidi override": (steps({}), ["--name", "abc\u202edcb"], "--name must be 1..200 printable characters"),
    "--name blank": (steps({}), ["--name", "  "], "--name must be 1..200 printable characters"),
}
PG_FOLDERS = ["--name with NUL", "--name of 201 characters", "a member stored twice"]


def _run_folder(case, url, tmp_path, capsys):
    build, extra, message = FOLDERS[case]
    folder = tmp_path / "f"
    folder.mkdir()
    build(folder)
    _refused_in_one_line(["evaluate", "--features", str(folder), *extra], url, message, capsys)


@pytest.mark.parametrize("case", list(FOLDERS))
def test_adversarial_folder_is_one_line_exit_2_nothing_written(case, tmp_path, capsys, no_hang):
    _run_folder(case, f"sqlite:///{tmp_path / 'f.db'}", tmp_path, capsys)


@pytest.mark.parametrize("case", PG_FOLDERS)
def test_adversarial_folder_on_postgresql(case, pg_url, tmp_path, capsys, no_hang):
    _run_folder(case, pg_url, tmp_path, capsys)


def test_a_folder_name_too_long_for_the_database_needs_a_name(tmp_path, capsys):
    folder = tmp_path / ("x" * 220)
    folder.mkdir()
    steps({})(folder)
    _refused_in_one_line(["evaluate", "--features", str(folder)], f"sqlite:///{tmp_path / 'f.db'}",
                         "the folder name (the default --name) must be 1..200 printable characters", capsys)
    assert main(["evaluate", "--features", str(folder), "--name", "short", "--db", f"sqlite:///{tmp_path / 'f.db'}"]) == 0


def test_float16_features_are_read_without_a_warning_line(tmp_path, capsys):
    folder = tmp_path / "f"
    folder.mkdir()
    steps({"query_features": _good()["query_features"].astype(np.float16)})(folder)
    assert main(["evaluate", "--features", str(folder), "--no-store"]) == 0
    assert capsys.readouterr().err == ""


def test_checkpoints_under_a_file_are_refused_before_any_row(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(_toml(BASE))
    (tmp_path / "ckfile").write_text("x")
    _refused_in_one_line(["run", str(path), "--quiet", "--checkpoints", str(tmp_path / "ckfile" / "sub")],
                         f"sqlite:///{tmp_path / 'c.db'}", "ckfile is not a folder", capsys)
