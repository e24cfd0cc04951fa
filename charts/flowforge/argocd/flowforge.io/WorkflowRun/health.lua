-- Argo CD health of a FlowForge WorkflowRun (resource.customizations.health.flowforge.io_WorkflowRun).
-- Queued: Suspended (a limit holds it); Running while a person holds it (an approval gate
-- awaits, or the run is paused): Suspended; Pending and Running: Progressing; Succeeded:
-- Healthy; Failed and Cancelled: Degraded; each with the run's own message.
-- Uses only what Argo CD's Lua VM opens (base and table libraries).
local hs = {}
local status = obj.status
if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted: the operator finishes its rollback first"
  if status ~= nil and status.message ~= nil and status.message ~= "" then
    hs.message = hs.message .. " (" .. status.message .. ")"
  end
  return hs
end
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the FlowForge operator to take the run"
  return hs
end
local generation = obj.metadata.generation
if status.observedGeneration ~= nil and generation ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "the operator has not yet observed generation " .. tostring(generation)
  return hs
end
local message = status.message
if message == nil or message == "" then
  message = status.phase
end
hs.message = message
if status.phase == "Succeeded" then
  hs.status = "Healthy"
elseif status.phase == "Failed" or status.phase == "Cancelled" then
  hs.status = "Degraded"
elseif status.phase == "Queued" then
  hs.status = "Suspended"
else
  hs.status = "Progressing"
  for _, condition in ipairs(status.conditions or {}) do
    if (condition.type == "AwaitingApproval" or condition.type == "Paused")
        and condition.status == "True" then
      hs.status = "Suspended"
    end
  end
end
return hs
