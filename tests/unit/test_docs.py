"""The documentation says what the code does: the profile reference is current and linked."""

from __future__ import annotations

from fsdpctl.profiles.reference import reference_markdown
from fsdpctl.profiles.schema import ClusterProfile
from tests.conftest import REPO


def test_docs_profiles_md_is_the_generated_reference():
    assert (REPO / "docs" / "profiles.md").read_text() == reference_markdown(), (
        "docs/profiles.md is stale: run `fsdpctl profiles --reference > docs/profiles.md`"
    )


def test_every_profile_field_is_documented_and_readme_links_the_reference():
    text = reference_markdown()
    for name in ClusterProfile.__dataclass_fields__:
        assert f"| `{name}` |" in text
    readme = (REPO / "README.md").read_text()
    assert "docs/profiles.md" in readme
