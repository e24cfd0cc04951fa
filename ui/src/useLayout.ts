// One worker for the page's layouts; a component asks for its graph's and re-renders once
// the answer is there (a newer request for the same component wins).
import { useEffect, useState } from "preact/hooks";
import type { Laid, LayoutRequest } from "./layout";

let worker: Worker | null = null;
let next = 0;
const waiting = new Map<number, (laid: Laid) => void>();

function layoutWorker(): Worker {
  if (!worker) {
    worker = new Worker(new URL("./layout.worker.ts", import.meta.url), { type: "module" });
    worker.onmessage = (event: MessageEvent<{ id: number; laid: Laid }>) => {
      waiting.get(event.data.id)?.(event.data.laid);
      waiting.delete(event.data.id);
    };
  }
  return worker;
}

/** Start the worker early (it loads and compiles while the page fetches its data). */
export function warmLayout(): void {
  layoutWorker();
}

export function useLayout(request: LayoutRequest | null): Laid | null {
  const [laid, setLaid] = useState<Laid | null>(null);
  useEffect(() => {
    if (!request) return;
    let current = true;
    const id = next++;
    waiting.set(id, (result) => current && setLaid(result));
    layoutWorker().postMessage({ id, request });
    return () => {
      current = false;
      waiting.delete(id);
    };
  }, [request]);
  return laid;
}
