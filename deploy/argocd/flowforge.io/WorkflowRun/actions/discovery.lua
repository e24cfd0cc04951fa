-- Argo CD actions of a FlowForge WorkflowRun: cancel while it has not finished (and no
-- cancel is asked yet); retry once it finished Failed or Cancelled.
local actions = {}
local phase = nil
if obj.status ~= nil then
  phase = obj.status.phase
end
local finished = phase == "Succeeded" or phase == "Failed" or phase == "Cancelled"
local cancelling = obj.spec ~= nil and obj.spec.cancel == true
actions["cancel"] = {["disabled"] = finished or cancelling or obj.metadata.deletionTimestamp ~= nil}
-- a run the store never took (its definition refused: no startedAt) has nothing to retry
local started = obj.status ~= nil and obj.status.startedAt ~= nil
actions["retry"] = {["disabled"] = not (started and (phase == "Failed" or phase == "Cancelled"))}
return actions
