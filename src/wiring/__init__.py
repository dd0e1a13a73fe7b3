"""The composition root's factories, grouped by concern: what `bootstrap.Container` calls to
build each part of the object graph. Only `bootstrap` imports these (import-linter)."""
