// Client-side routes on the History API; the server answers index.html for every path
// outside /api/, so a route is also a link that can be shared or reloaded.
import { useEffect, useState } from "preact/hooks";

export type Route =
  | { page: "runs" }
  | { page: "run"; namespace: string; name: string }
  | { page: "definitions" }
  | { page: "definition"; namespace: string; name: string }
  | { page: "schedules" }
  | { page: "schedule"; namespace: string; name: string }
  | { page: "missing"; path: string };

export function parse(pathname: string): Route {
  const parts = pathname.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length === 0 || (parts.length === 1 && parts[0] === "runs")) return { page: "runs" };
  if (parts[0] === "runs" && parts.length === 3)
    return { page: "run", namespace: parts[1], name: parts[2] };
  if (parts[0] === "definitions" && parts.length === 1) return { page: "definitions" };
  if (parts[0] === "definitions" && parts.length === 3)
    return { page: "definition", namespace: parts[1], name: parts[2] };
  if (parts[0] === "schedules" && parts.length === 1) return { page: "schedules" };
  if (parts[0] === "schedules" && parts.length === 3)
    return { page: "schedule", namespace: parts[1], name: parts[2] };
  return { page: "missing", path: pathname };
}

const seg = encodeURIComponent;

export const href = {
  runs: (query = "") => `/runs${query}`,
  run: (ns: string, name: string) => `/runs/${seg(ns)}/${seg(name)}`,
  definitions: (query = "") => `/definitions${query}`,
  definition: (ns: string, name: string) => `/definitions/${seg(ns)}/${seg(name)}`,
  schedules: (query = "") => `/schedules${query}`,
  schedule: (ns: string, name: string) => `/schedules/${seg(ns)}/${seg(name)}`,
};

export function navigate(to: string, replace = false): void {
  if (replace) history.replaceState(null, "", to);
  else history.pushState(null, "", to);
  dispatchEvent(new PopStateEvent("popstate"));
}

/** Follows same-origin link clicks without a reload (modifier clicks open tabs as usual). */
export function interceptLinks(event: MouseEvent): void {
  if (event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const anchor = (event.target as Element | null)?.closest("a");
  if (!anchor || anchor.target || anchor.origin !== location.origin) return;
  if (anchor.pathname.startsWith("/api/")) return;
  event.preventDefault();
  navigate(anchor.pathname + anchor.search);
}

export function useLocation(): { route: Route; search: URLSearchParams } {
  const read = () => ({ route: parse(location.pathname), search: new URLSearchParams(location.search) });
  const [state, setState] = useState(read);
  useEffect(() => {
    const update = () => setState(read());
    addEventListener("popstate", update);
    return () => removeEventListener("popstate", update);
  }, []);
  return state;
}
