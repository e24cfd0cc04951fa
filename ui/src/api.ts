// The shapes of /api/v1 (docs/api.md) and the one client every page uses. Every request
// carries the signed-in user's bearer token, the live stream included (fetch, not
// EventSource, which cannot send headers).
import { authHeaders } from "./auth";

export type Progress = {
  total: number;
  succeeded: number;
  failed: number;
  running: number;
  waiting: number;
  skipped: number;
  cancelled: number;
};

export type Condition = {
  type: string;
  status: string;
  reason: string | null;
  message: string | null;
  lastTransitionTime: string | null;
};

export type RunSummary = {
  namespace: string;
  name: string;
  uid: string;
  workflow: string;
  version: number;
  phase: string;
  compensating: boolean;
  queue: { reason: string; message: string; position: number | null } | null;
  progress: Progress;
  createdAt: string | null;
  startedAt: string | null;
  finishedAt: string | null;
  durationSeconds: number | null;
};

export type TaskBrief = {
  name: string;
  type: string;
  state: string;
  dependsOn: string[];
  level: number;
  attempts: number;
  exitCode: number | null;
  reason: string | null;
  startedAt: string | null;
  finishedAt: string | null;
  durationSeconds: number | null;
  compensator: { state: string; type: string } | null;
};

export type Attempt = {
  number: number;
  jobName: string | null;
  state: string;
  exitCode: number | null;
  reason: string | null;
  message: string | null;
  startedAt: string | null;
  finishedAt: string | null;
  durationSeconds: number | null;
};

export type TaskDetail = TaskBrief & {
  attemptHistory: Attempt[];
  compensatorAttempts: Attempt[];
};

export type CompensationStep = {
  order: number;
  task: string;
  compensator: string;
  state: string;
  startedAt: string | null;
  finishedAt: string | null;
};

export type Compensation = {
  state: string;
  haltedBy: string | null;
  triggeredBy: string | null;
  steps: CompensationStep[];
};

export type RunEvent = { at: string; kind: string; task: string | null; message: string };

export type RunDetail = RunSummary & {
  parameters: Record<string, unknown>;
  retryOf: string | null;
  conditions: Condition[];
  tasks: TaskBrief[];
  tasksOmitted?: boolean;
  compensation: Compensation;
  events: RunEvent[];
};

export type GraphNode = { id: string; type: string; state: string | null; level: number };

export type Graph = {
  nodes: GraphNode[];
  edges: [string, string][];
  rollback: string[];
  levels: number;
};

export type RunChange = {
  run: RunSummary & { conditions: Condition[] };
  states: Record<string, string>;
  compensation: Compensation;
};

export type DefinitionVersionSummary = {
  version: number;
  fingerprint: string;
  publishedAt: string | null;
  tasks: number;
};

export type DefinitionSummary = {
  namespace: string;
  name: string;
  versions: DefinitionVersionSummary[];
};

export type TaskType = { image: string; command: string[] | null; args: string[] | null };

export type DefinitionVersion = {
  version: number;
  fingerprint: string;
  publishedAt: string | null;
  taskTypes: Record<string, TaskType>;
  graph: Graph;
};

export type DefinitionDetail = { namespace: string; name: string; versions: DefinitionVersion[] };

export type Page<T> = { items: T[]; continue?: string | null };

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

async function failure(response: Response): Promise<ApiError> {
  let reason = response.statusText || "Error";
  let message = `${response.status} ${reason}`;
  try {
    const body = (await response.json()) as { error?: { reason?: string; message?: string } };
    reason = body.error?.reason ?? reason;
    message = body.error?.message ?? message;
  } catch {
    // Not the JSON error shape (a proxy's page, say): the status line is all we know.
  }
  return new ApiError(response.status, reason, message);
}

async function request(path: string, init: RequestInit = {}): Promise<Response> {
  const response = await fetch(`/api/v1${path}`, {
    ...init,
    headers: { Accept: "application/json", ...authHeaders(), ...(init.headers ?? {}) },
  });
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  return (await (await request(path, { signal })).json()) as T;
}

export async function getText(path: string, signal?: AbortSignal): Promise<string> {
  return (await request(path, { signal, headers: { Accept: "text/plain" } })).text();
}

export async function post<T>(path: string): Promise<T> {
  // The server refuses a POST without this header: a cross-site form or text/plain fetch
  // cannot send it without a CORS preflight, which the server never grants.
  return (await (await request(path, { method: "POST", headers: { "X-FlowForge-Request": "1" } }))
    .json()) as T;
}

const seg = encodeURIComponent;

export const paths = {
  run: (ns: string, name: string) => `/namespaces/${seg(ns)}/runs/${seg(name)}`,
  task: (ns: string, name: string, task: string) =>
    `/namespaces/${seg(ns)}/runs/${seg(name)}/tasks/${seg(task)}`,
  definitions: (ns: string) => `/namespaces/${seg(ns)}/definitions`,
  definition: (ns: string, name: string) => `/namespaces/${seg(ns)}/definitions/${seg(name)}`,
};

export type StreamHandlers = {
  onSnapshot: (change: RunChange) => void;
  onChange: (change: RunChange) => void;
};

/** Reads one server-sent-event stream to its end; resolves when the server closes it. */
export async function readStream(
  path: string,
  handlers: StreamHandlers,
  signal: AbortSignal,
): Promise<void> {
  const response = await request(path, { signal, headers: { Accept: "text/event-stream" } });
  if (!response.body) throw new ApiError(0, "Unavailable", "the stream has no body");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end = buffer.indexOf("\n\n");
    while (end >= 0) {
      dispatch(buffer.slice(0, end), handlers);
      buffer = buffer.slice(end + 2);
      end = buffer.indexOf("\n\n");
    }
  }
}

function dispatch(block: string, handlers: StreamHandlers): void {
  let event = "message";
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (data.length === 0) return;
  const change = JSON.parse(data.join("\n")) as RunChange;
  if (event === "snapshot") handlers.onSnapshot(change);
  else if (event === "change") handlers.onChange(change);
}
