// Pure frontend logic of the gpulab extension: formatting, choices, warnings, the wait for the
// restarted server. No JupyterLab imports here, so jest tests it without a browser.

export interface IStatus {
  gpulab: boolean;
  user: string;
  mode: string;
  gpu_type: string; // a catalog slug, or "none"
  gpu_count: number;
  simulated: boolean;
  pricing: string;
  price_per_hour: string | null;
  currency: string;
  image: string;
  datasets: string[];
  allocation_id: string;
  started_at: number; // seconds since the epoch
  elapsed_seconds: number;
  session_cost: string | null;
  low_balance_minutes: number;
  spot_refresh_seconds?: number;
  spot_warning_refresh_seconds?: number;
  server_id: string; // random per server process
}

/** What `ping` answers: which server process is behind this URL. */
export interface IServerId {
  gpulab: boolean;
  server_id: string;
}

export interface IBalance {
  available: boolean;
  reason?: string;
  balance?: string;
  currency?: string;
  burn_rate_per_hour?: string | null;
  time_left_seconds?: number | null;
  warnings?: string[];
}

export interface IPoolType {
  slug: string;
  display_name: string;
  vram_gb: number;
  on_demand_price: string;
  total: number;
  free: number;
  simulated: number;
}

/** The hub's price of one choice for the viewer (billing's price function). */
export interface IYourPrice {
  price_per_hour: string; // per card-hour (per hour in no-GPU mode)
  price_kind: string; // "on-demand" or "education" (a course's student)
}

/** The viewer's own on-demand prices, as the hub's pool and catalog answers give them. */
export interface IYourPrices {
  gpu_types: { [slug: string]: IYourPrice };
  no_gpu: IYourPrice;
}

export interface IPool {
  currency: string;
  gpu_types: IPoolType[];
  no_gpu: { available: boolean; price_per_hour: string };
  your_prices?: IYourPrices;
}

export interface ICatalogDataset {
  slug: string;
  display_name: string;
  description: string;
  size: string;
  license: string;
}

export interface ICatalog {
  currency: string;
  max_gpus_per_server: number;
  no_gpu: { display_name: string; price_per_hour: string; description: string };
  gpu_types: { [slug: string]: { display_name: string; on_demand_price: string } };
  datasets: { [slug: string]: ICatalogDataset };
  your_prices?: IYourPrices;
}

/** "CNY 2.10"; amounts below 1 keep 4 decimals so a fresh session's cost visibly moves. */
export function formatMoney(
  amount: string | number | null | undefined,
  currency: string,
  precise = false
): string {
  const value = typeof amount === 'string' ? Number(amount) : amount;
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '?';
  }
  const digits = precise && Math.abs(value) < 1 ? 4 : 2;
  return `${currency} ${value.toFixed(digits)}`.trim();
}

/** "CNY 2.10/h" */
export function formatRate(price: string | null | undefined, currency: string): string {
  return `${formatMoney(price, currency)}/h`;
}

/** 59 -> "<1m", 300 -> "5m", 7500 -> "2h 05m", 200000 -> "2d 7h". */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '?';
  }
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return '<1m';
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return `${minutes}m`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 48) {
    return `${hours}h ${String(minutes % 60).padStart(2, '0')}m`;
  }
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/**
 * What this server costs per hour now, as the hub priced it (with the function billing rates
 * by): on a spot server the hub's spot status says (`spotPricePerHour`: the spot price in force,
 * never above the bid, times the cards; null while unknown), else the price the hub wrote into
 * the server at its start (a course server's: the education price). Never computed here.
 */
export function priceNow(status: IStatus, spotPricePerHour?: string | null): string | null {
  if (status.pricing === 'spot') {
    return spotPricePerHour ?? null;
  }
  return status.price_per_hour;
}

/**
 * Most this session can have cost at `nowMs`: the price since the server started. Billing charges
 * only the seconds in which a kernel or app runs, so the bill is at most this (on spot, where
 * the price moves, about this).
 */
export function sessionCost(
  status: IStatus,
  nowMs: number,
  price: string | null = status.price_per_hour
): number | null {
  if (price === null) {
    return null;
  }
  const elapsed = Math.max(0, nowMs / 1000 - status.started_at);
  return (Number(price) * elapsed) / 3600;
}

export interface IStatusParts {
  mode: string;
  price: string;
  cost: string;
  balance: string;
  title: string;
}

/**
 * The status bar's texts. `spotPricePerHour`: a spot server's price per hour now from the hub's
 * spot status (see `priceNow`).
 */
export function statusParts(
  status: IStatus,
  balance: IBalance | null,
  nowMs: number,
  spotPricePerHour?: string | null
): IStatusParts {
  const now = priceNow(status, spotPricePerHour);
  const spot = status.pricing === 'spot';
  const price = formatRate(now, status.currency);
  const sofar = formatMoney(sessionCost(status, nowMs, now), status.currency, true);
  const cost = `session ${spot ? '≈' : '≤'} ${sofar}`;
  let balanceText = 'balance …';
  if (balance && !balance.available) {
    balanceText = 'balance unavailable';
  } else if (balance && balance.available) {
    const currency = balance.currency || status.currency;
    balanceText = `balance ${formatMoney(balance.balance, currency)}`;
    if (balance.time_left_seconds !== null && balance.time_left_seconds !== undefined) {
      balanceText += ` (${formatDuration(balance.time_left_seconds)} left)`;
    }
  }
  const title = [
    `Mode: ${status.mode}${status.simulated ? ' — the GPUs are simulated' : ''}`,
    spot
      ? `Price: ${price} (spot, now${status.gpu_count > 1 ? `, ${status.gpu_count} cards` : ''})`
      : `Price: ${price} (${status.pricing})`,
    `This session so far: ${spot ? 'about' : 'at most'} ${sofar} ` +
      '(billed only for the seconds in which a kernel or app runs)',
    balance && !balance.available
      ? `Balance unavailable: ${balance.reason || 'billing not reachable'}`
      : balanceText.replace(/^balance/, 'Balance:')
  ].join('\n');
  return { mode: status.mode, price, cost, balance: balanceText, title };
}

export function isNoGpu(status: IStatus): boolean {
  return status.gpu_type === 'none';
}

/** Command label of the no-GPU switch: "Switch to no-GPU mode (CNY 0.09/h)". */
export function noGpuLabel(noGpuPrice: string, currency: string): string {
  return `Switch to no-GPU mode (${formatRate(noGpuPrice, currency)})`;
}

export interface IGpuChoice {
  slug: string;
  label: string;
  free: number;
  price: string;
  disabled: boolean;
}

/**
 * The GPU types to offer, with free cards and price; types without a free card are disabled.
 * The price is the viewer's own as the hub answers it (a course's student: the education
 * price); a hub that does not say falls back to the on-demand price.
 */
export function gpuChoices(pool: IPool): IGpuChoice[] {
  return pool.gpu_types
    .filter(t => t.total > 0)
    .map(t => {
      const sim = t.simulated > 0 ? ' (simulated)' : '';
      const yours = pool.your_prices?.gpu_types[t.slug];
      const price = yours ? yours.price_per_hour : t.on_demand_price;
      const kind = yours && yours.price_kind === 'education' ? ' (education price)' : '';
      return {
        slug: t.slug,
        label: `${t.display_name}${sim} — ${t.free} of ${t.total} free — ${formatRate(
          price,
          pool.currency
        )} per card${kind}`,
        free: t.free,
        price,
        disabled: t.free < 1
      };
    });
}

/** What the confirmation says about money: "CNY 2.10/h → CNY 0.09/h" or "stays CNY 2.10/h". */
export function priceChange(
  from: string | null,
  to: string | null,
  currency: string
): string {
  if (from !== null && to !== null && Number(from) === Number(to)) {
    return `The price stays ${formatRate(to, currency)}.`;
  }
  return `Price: ${formatRate(from, currency)} → ${formatRate(to, currency)}.`;
}

/** The dataset list after mounting or unmounting `slug` (order kept, no duplicates). */
export function datasetsAfter(current: string[], slug: string, mount: boolean): string[] {
  const rest = current.filter(d => d !== slug);
  return mount ? [...rest, slug] : rest;
}

/**
 * Low-balance messages not shown yet: billing's own warnings, and ours when the balance lasts
 * less than `lowMinutes` at the current rate (again at 10, 5 and 1 minutes left). `shown`
 * remembers what was already notified.
 */
export function newBalanceWarnings(
  balance: IBalance | null,
  lowMinutes: number,
  shown: Set<string>
): string[] {
  if (!balance || !balance.available) {
    return [];
  }
  const out: string[] = [];
  for (const w of balance.warnings || []) {
    if (!shown.has(w)) {
      out.push(w);
    }
  }
  const left = balance.time_left_seconds;
  if (left !== null && left !== undefined) {
    // Announce each threshold crossed once (the configured one, then 10, 5 and 1 minutes
    // left), so a falling balance is announced again but not on every poll.
    const thresholds = [lowMinutes * 60, 600, 300, 60].filter(t => t <= lowMinutes * 60);
    const crossed = thresholds.filter(t => left < t);
    const key = crossed.length ? `low:${Math.min(...crossed)}` : '';
    if (key && !shown.has(key)) {
      out.push(
        `Low balance: ${formatMoney(balance.balance, balance.currency || '')} lasts about ` +
          `${formatDuration(left)} at the current rate. Top up, or switch to no-GPU mode.`
      );
      shown.add(key);
    }
  }
  for (const w of out) {
    shown.add(w);
  }
  return out;
}

export interface IWaitOptions {
  fetchServer: () => Promise<IServerId | null>;
  oldServerId: string;
  intervalMs?: number;
  timeoutMs?: number;
  now?: () => number;
  sleep?: (ms: number) => Promise<void>;
  onTick?: (elapsedMs: number) => void;
}

/**
 * Poll until a *different* server process answers at this server's URL. Errors and
 * non-gpulab answers (the proxy's and hub's "server not ready" pages) mean "not yet".
 */
export async function waitForNewServer(opts: IWaitOptions): Promise<IServerId> {
  const now = opts.now || (() => Date.now());
  const sleep = opts.sleep || ((ms: number) => new Promise<void>(r => setTimeout(r, ms)));
  const interval = opts.intervalMs ?? 300;
  const timeout = opts.timeoutMs ?? 120000;
  const t0 = now();
  for (;;) {
    let answer: IServerId | null = null;
    try {
      answer = await opts.fetchServer();
    } catch {
      answer = null;
    }
    if (answer && answer.gpulab && answer.server_id && answer.server_id !== opts.oldServerId) {
      return answer;
    }
    const elapsed = now() - t0;
    if (elapsed >= timeout) {
      throw new Error(
        `the new server did not answer within ${Math.round(timeout / 1000)} s`
      );
    }
    opts.onTick?.(elapsed);
    await sleep(interval);
  }
}

/**
 * Whether this page load asks for nothing but the default workspace: no file or folder in the
 * URL (`/lab/tree/...`), no `?reset`, `?clone` or `?path`, so an empty main area after restore
 * means the launcher is what the user will get anyway.
 */
export function plainLabUrl(treePath: string, search: string): boolean {
  if (treePath) {
    return false;
  }
  const query = new URLSearchParams(search);
  return !['reset', 'clone', 'path', 'file'].some(key => query.has(key));
}
