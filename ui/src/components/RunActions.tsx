// A person's actions about a run (WorkflowRunActions): the ones the operator processed, from
// the run's history, and the buttons that create one as the signed-in user: Pause/Resume,
// Retry/Skip the compensator a halted rollback stopped at, Approve/Reject a gate awaiting
// approval. Each asks for a reason (required for Reject and SkipCompensator) before posting;
// the apiserver and admission judge the user, then the operator applies or refuses it.
import { useState } from "preact/hooks";
import { paths, post, type ActionReference, type ActionRequest, type Compensation, type RunAction } from "../api";
import { time } from "../format";

type Kind = ActionRequest["action"];
type Choice = { action: Kind; task?: string; compensator?: string; label: string };

const NEEDS_REASON = new Set<Kind>(["Reject", "SkipCompensator"]);
const MAX_REASON = 1024;

/** The actions that make sense now; the operator judges them again when it applies them. */
function choices(props: { final: boolean; paused: boolean; compensation?: Compensation; awaiting: string[] }): Choice[] {
  const found: Choice[] = [];
  if (!props.final) found.push(props.paused ? { action: "Resume", label: "Resume" } : { action: "Pause", label: "Pause" });
  if (props.compensation?.state === "Halted") {
    for (const step of props.compensation.steps.filter((s) => s.state === "failed")) {
      found.push({ action: "RetryCompensator", compensator: step.compensator, label: `Retry compensator ${step.compensator}` });
      found.push({ action: "SkipCompensator", compensator: step.compensator, label: `Skip compensator ${step.compensator}` });
    }
  }
  for (const task of props.awaiting) {
    found.push({ action: "Approve", task, label: `Approve ${task}` });
    found.push({ action: "Reject", task, label: `Reject ${task}` });
  }
  return found;
}

export function RunActions(props: {
  namespace: string; name: string; actions: RunAction[]; final: boolean; paused: boolean;
  compensation?: Compensation; awaiting: string[]; onSent: (action: ActionReference) => void;
}) {
  const [chosen, setChosen] = useState<Choice | null>(null);
  const [reason, setReason] = useState("");
  const [busy, setBusy] = useState(false);
  const [note, setNote] = useState<{ text: string; error: boolean } | null>(null);
  const available = choices(props);
  const needed = chosen !== null && NEEDS_REASON.has(chosen.action);

  const send = async () => {
    if (!chosen) return;
    setBusy(true);
    setNote(null);
    const body: ActionRequest = { action: chosen.action };
    if (chosen.task) body.task = chosen.task;
    if (chosen.compensator) body.compensator = chosen.compensator;
    if (reason.trim()) body.reason = reason.trim();
    try {
      const made = await post<ActionReference>(paths.actions(props.namespace, props.name), body);
      setNote({ text: `${chosen.label}: sent as ${made.name}; the operator applies it and records the result below.`, error: false });
      setChosen(null);
      setReason("");
      props.onSent(made);
    } catch (e) {
      setNote({ text: `${chosen.label} refused: ${(e as Error).message}`, error: true });
    } finally {
      setBusy(false);
    }
  };

  return (
    <>
      {props.paused && <p data-testid="paused" class="muted">Paused: no task or compensator starts until it is resumed.</p>}
      {available.length > 0 && !chosen && (
        <div class="actions" role="group" aria-label="Act on this run">
          {available.map((c) => (
            <button type="button" key={c.label} onClick={() => { setChosen(c); setNote(null); }}>{c.label}</button>
          ))}
        </div>
      )}
      {chosen && (
        <form class="act" data-testid="action-form" onSubmit={(e) => { e.preventDefault(); void send(); }}>
          <label for="action-reason">Reason{needed ? " (required)" : " (optional)"}</label>
          <textarea id="action-reason" rows={2} maxLength={MAX_REASON} required={needed} value={reason}
            onInput={(e) => setReason((e.target as HTMLTextAreaElement).value)} />
          <span role="group" class="actions">
            <button type="submit" disabled={busy || (needed && !reason.trim())}>Send: {chosen.label}</button>
            <button type="button" onClick={() => setChosen(null)}>Back</button>
          </span>
        </form>
      )}
      {note && <p role={note.error ? "alert" : "status"} class={note.error ? "error" : "muted"}>{note.text}</p>}
      <table data-testid="run-actions">
        <thead>
          <tr><th scope="col">At</th><th scope="col">Action</th><th scope="col">On</th><th scope="col">By</th><th scope="col">Result</th><th scope="col">Reason</th><th scope="col">Message</th></tr>
        </thead>
        <tbody>
          {props.actions.map((a) => (
            <tr key={a.name} data-action={a.name} data-kind={a.action} data-result={a.result}>
              <td>{time(a.at)}</td><td>{a.action}</td><td>{a.compensator ?? a.task ?? "the run"}</td>
              <td title={a.actor?.groups.join(", ")}>{a.actor?.username ?? "—"}</td>
              <td><span class={`badge ${a.result === "Accepted" ? "st-succeeded" : "st-failed"}`}>{a.result}</span></td>
              <td>{a.reason || "—"}</td><td>{a.message}</td>
            </tr>
          ))}
          {props.actions.length === 0 && <tr><td colSpan={7} class="muted">Nobody has acted on this run.</td></tr>}
        </tbody>
      </table>
    </>
  );
}
