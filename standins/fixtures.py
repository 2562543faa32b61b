"""Where the project's fixture models live: real tokenizers and chat templates, checked in under
fixtures/ at the top of the repository (each folder's SOURCE.md says where its files came from and
LICENSE what they may be used for). The engine stand-ins, the tests and bench/ all find them here."""

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
FIXTURES = REPOSITORY / "fixtures"
FIXTURE_MODELS = FIXTURES / "models"
FIXTURE_SPECS = FIXTURES / "specs"
