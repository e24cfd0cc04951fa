// The shapes of /api/v1 (docs/api.md; generated from docs/openapi.json into api-schema.ts by
// `npm run api-types`, checked current by tests/ui/test_build.py) and the one client every
// page uses. Every request
// carries the signed-in user's bearer token, the live stream included (fetch, not
// EventSource, which cannot send headers).
import type { components, operations } from "./api-schema";
import { authHeaders } from "./auth";

type Schemas = components["schemas"];
type Query<Op extends keyof operations> = NonNullable<operations[Op]["parameters"]["query"]>;

export type Progress = Schemas["Progress"];
export type Condition = Schemas["Condition"];
export type RunSummary = Schemas["RunSummary"];
export type TaskBrief = Schemas["TaskBrief"];
export type Attempt = Schemas["Attempt"];
export type TaskDetail = Schemas["TaskDetail"];
export type CompensationStep = Schemas["CompensationStep"];
export type Compensation = Schemas["Compensation"];
export type Finally = Schemas["Finally"];
export type FinalStep = Schemas["FinalStep"];
export type RunEvent = Schemas["HistoryEntry"];
export type RunDetail = Schemas["RunDetail"];
export type GraphNode = Schemas["GraphNode"];
export type Graph = Schemas["Graph"];
export type RunChange = Schemas["RunChange"];
export type DefinitionVersionSummary = Schemas["DefinitionVersionBrief"];
export type DefinitionSummary = Schemas["DefinitionSummary"];
export type TaskType = Schemas["TaskTypeBrief"];
export type DefinitionVersion = Schemas["DefinitionVersion"];
export type DefinitionDetail = Schemas["DefinitionDetail"];
export type RunAction = Schemas["RunAction"];
export type ActionRequest = Schemas["ActionRequest"];
export type ActionReference = Schemas["ActionReference"];
export type ScheduleSummary = Schemas["ScheduleSummary"];
export type ScheduleDetail = Schemas["ScheduleDetail"];
export type ScheduledRun = Schemas["ScheduledRun"];

export type RunList = Schemas["RunList"];
export type RunsQuery = Query<"list_runs_api_v1_runs_get">;
export type NamespaceList = Schemas["NamespaceList"];
export type NamespacesQuery = Query<"namespaces_api_v1_namespaces_get">;
export type DefinitionList = Schemas["DefinitionList"];
export type ScheduleList = Schemas["ScheduleList"];

/** A query string of the parameters that are set (`?a=1&b=x`, or "" when none is). */
export function queryString(query: Record<string, string | number | null | undefined>): string {
  const set = Object.entries(query).filter((entry): entry is [string, string | number] => entry[1] != null && entry[1] !== "");
  return set.length ? `?${new URLSearchParams(set.map(([key, value]) => [key, String(value)]))}` : "";
}

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

export async function post<T>(path: string, body?: unknown): Promise<T> {
  // The server refuses a POST without this header: a cross-site form or text/plain fetch
  // cannot send it without a CORS preflight, which the server never grants.
  const headers: Record<string, string> = { "X-FlowForge-Request": "1" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const init: RequestInit = { method: "POST", headers };
  if (body !== undefined) init.body = JSON.stringify(body);
  return (await (await request(path, init)).json()) as T;
}

const seg = encodeURIComponent;

export const paths = {
  run: (ns: string, name: string) => `/namespaces/${seg(ns)}/runs/${seg(name)}`,
  task: (ns: string, name: string, task: string) =>
    `/namespaces/${seg(ns)}/runs/${seg(name)}/tasks/${seg(task)}`,
  definitions: (ns: string) => `/namespaces/${seg(ns)}/definitions`,
  definition: (ns: string, name: string) => `/namespaces/${seg(ns)}/definitions/${seg(name)}`,
  actions: (ns: string, name: string) => `/namespaces/${seg(ns)}/runs/${seg(name)}/actions`,
  schedules: (ns: string) => `/namespaces/${seg(ns)}/schedules`,
  schedule: (ns: string, name: string) => `/namespaces/${seg(ns)}/schedules/${seg(name)}`,
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
