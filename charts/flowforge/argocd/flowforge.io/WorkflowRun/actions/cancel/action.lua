-- Cancel the run: no new task starts, running tasks stop, and what succeeded is rolled
-- back in reverse dependency order (the same as `flowforge cancel`).
obj.spec.cancel = true
return obj
