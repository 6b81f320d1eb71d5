"""Import-string factories for tests that drive the CLI like an outside user would."""

from tests.mutants import MUTANTS

no_free_on_finish = MUTANTS["no_free_on_finish"].factory
