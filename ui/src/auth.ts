// Who the UI acts as: a token pasted by the user (kept for this tab only, in
// sessionStorage), or none, when an authenticating proxy in front of the server adds the
// user's own token to every request.
const KEY = "flowforge.token";

export function token(): string | null {
  return sessionStorage.getItem(KEY);
}

export function setToken(value: string | null): void {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

export function authHeaders(): Record<string, string> {
  const value = token();
  return value ? { Authorization: `Bearer ${value}` } : {};
}
