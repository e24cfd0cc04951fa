// How times, durations and phases read on every page.
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)}ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m}m${Math.floor(seconds % 60)}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h${m % 60}m`;
  return `${Math.floor(h / 24)}d${h % 24}h`;
}

export function age(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return "—";
  const seconds = Math.max(0, (now - Date.parse(iso)) / 1000);
  return duration(Math.floor(seconds)).replace(/\.\d/, "");
}

/** How long until a future time (a schedule's next fire), as ``age`` reads a past one. */
export function until(iso: string, now: number = Date.now()): string {
  return age(new Date(now).toISOString(), Date.parse(iso));
}

export function time(iso: string | null | undefined): string {
  if (!iso) return "—";
  return new Date(iso).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export const FINAL_PHASES = new Set(["Succeeded", "Failed", "Cancelled"]);

export const KNOWN_PHASES = ["Pending", "Queued", "Running", "Succeeded", "Failed", "Cancelled"];

const KNOWN_STATES = new Set([
  "waiting", "ready", "admitting", "running", "succeeded", "failed", "skipped", "cancelled",
  "not_triggered", "pending", "awaiting",
]);

/** The CSS class of a task or compensator state; an unknown one is shown neutrally. */
export function stateClass(state: string | null | undefined): string {
  return state && KNOWN_STATES.has(state) ? `st-${state}` : "st-unknown";
}

export function phaseClass(phase: string): string {
  return KNOWN_PHASES.includes(phase) ? `ph-${phase}` : "ph-unknown";
}

export function label(state: string | null | undefined): string {
  return state ? state.replace(/_/g, " ") : "—";
}
