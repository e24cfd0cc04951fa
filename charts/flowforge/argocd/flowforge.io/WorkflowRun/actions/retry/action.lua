-- Retry a Failed or Cancelled run: a new WorkflowRun with spec.retryOf naming this one and
-- the same workflow, version and parameters (the webhook checks them); the tasks whose
-- work still stands are reused. Argo CD creates it (an action that returns resources).
local run = {}
run.apiVersion = obj.apiVersion
run.kind = obj.kind
run.metadata = {}
-- (no string library in Argo CD's VM: a run named longer than 232 characters gets a name
-- the apiserver refuses, with its message)
run.metadata.name = obj.metadata.name .. "-retry-" .. os.date("!%Y%m%d%H%M%S")
run.metadata.namespace = obj.metadata.namespace
run.spec = {}
run.spec.workflow = obj.spec.workflow
run.spec.version = obj.spec.version
run.spec.parameters = obj.spec.parameters
run.spec.priority = obj.spec.priority
run.spec.maxParallelTasks = obj.spec.maxParallelTasks
run.spec.retryOf = obj.metadata.name
local impacted = {}
impacted[1] = {operation = "create", resource = run}
return impacted
