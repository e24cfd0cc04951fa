-- Argo CD health of a FlowForge WorkflowDefinition (resource.customizations.health.flowforge.io_WorkflowDefinition).
-- Published (Ready): Healthy; refused by the operator (Stalled): Degraded with why;
-- otherwise Progressing until the operator has published it.
local hs = {}
hs.status = "Progressing"
hs.message = "waiting for the FlowForge operator to publish it"
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Stalled" and condition.status == "True" then
    hs.status = "Degraded"
    hs.message = condition.message
    return hs
  end
  if condition.type == "Ready" and condition.status == "True" then
    hs.status = "Healthy"
    hs.message = condition.message
  end
end
return hs
