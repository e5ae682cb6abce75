"""generated/ is committed: it must be exactly what the templates render (`lucegen build --all --check`)."""

from __future__ import annotations

from lucegen.cli import main


def test_generated_sources_are_fresh(capsys):
    code = main(["build", "--all", "--check"])
    err = capsys.readouterr().err
    assert code == 0, f"generated/ is stale; run `python -m lucegen.cli build --all`:\n{err}"
