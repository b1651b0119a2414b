from pathlib import Path

from namesrv.config import options_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_reference_lists_every_key_as_the_code_defines_it():
    assert options_markdown() in README.read_text()
