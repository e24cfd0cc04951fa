// Loading data: once, or again every few seconds while the page is open.
import { useEffect, useRef, useState } from "preact/hooks";

export type Loaded<T> = { data?: T; error?: Error; loading: boolean; reload: () => void };

export function useData<T>(
  load: (signal: AbortSignal) => Promise<T>,
  deps: unknown[],
  everyMs?: number,
  enabled = true,
): Loaded<T> {
  const [state, setState] = useState<{ data?: T; error?: Error; loading: boolean }>({ loading: true });
  const [tick, setTick] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  useEffect(() => {
    if (!enabled) return;
    const abort = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async () => {
      try {
        const data = await loadRef.current(abort.signal);
        if (!abort.signal.aborted) setState({ data, loading: false });
      } catch (e) {
        if (!abort.signal.aborted) setState((s) => ({ data: s.data, error: e as Error, loading: false }));
      }
      if (everyMs && !abort.signal.aborted) timer = setTimeout(run, everyMs);
    };
    setState((s) => ({ ...s, loading: true }));
    void run();
    return () => {
      abort.abort();
      clearTimeout(timer);
    };
  }, [...deps, tick, enabled]);
  return { ...state, reload: () => setTick((t) => t + 1) };
}

/** The current time, refreshed every `everyMs`, for ages that count up. */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return now;
}
