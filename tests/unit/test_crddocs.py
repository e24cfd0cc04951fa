"""The CRD reference in docs/ is generated from the CRDs and kept up to date."""

from __future__ import annotations

from flowforge.kube.crddocs import default_out_path, main, render_reference


def test_the_checked_in_reference_is_up_to_date() -> None:
    assert main(["--check"]) == 0, "run: python -m flowforge.kube.crddocs"


def test_the_reference_documents_every_spec_field_with_its_description() -> None:
    reference = render_reference()
    for path in (
        "spec.tasks[].dependsOn",
        "spec.taskTypes{name}.image",
        "spec.tasks[].key",
        "spec.parameters",
        "spec.cancel",
        "status.phase",
    ):
        assert f"`{path}`" in reference, path
    row = next(line for line in reference.splitlines() if line.startswith("| `spec.workflow` |"))
    description = row.split("|")[4].strip()
    assert len(description) > 10


def test_a_stale_reference_is_detected(tmp_path: object) -> None:
    from pathlib import Path

    stale = Path(str(tmp_path)) / "reference.md"
    stale.write_text("old\n")
    assert main(["--check", "--out", str(stale)]) == 1
    assert default_out_path().name == "crd-reference.md"
