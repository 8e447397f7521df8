// Spot servers: the price text, the preemption countdown and the warning's state machine. Pure
// logic (no JupyterLab imports), so jest tests it without a browser.
import { formatMoney, formatRate } from './logic';

/** The user's checkpoint command, as the hub recorded it (it records it once it has ended). */
export interface ICheckpoint {
  state: 'running' | 'done' | 'failed';
  exit_code: number | null;
  error: string | null;
  command: string | null;
  log: string | null; // "~/.gpulab/checkpoints/20261130T011500Z.log"
}

export interface IPreemption {
  id: string;
  status: 'warning' | 'cancelled' | 'stopped';
  // "price-above-max" | "on-demand-reclaim" | "low-price-window-ended" | "reserved"
  reason: string;
  price: string | null; // the spot price when the warning went out
  max_price: string | null;
  warned_at: number | null;
  deadline: number; // hub clock, seconds since the epoch
  seconds_left: number | null;
  cancelled_at: number | null;
  stopped_at: number | null;
  signalled: number; // server processes that got SIGUSR1
  checkpoint: ICheckpoint | null;
}

/** What the server extension's `gpulab/api/spot` answers. */
export interface ISpotStatus {
  spot: boolean;
  pricing?: string;
  available?: boolean;
  reason?: string;
  running?: boolean;
  gpu_type?: string | null;
  price?: string | null; // per card-hour
  max_price?: string | null; // per card-hour
  // This server per hour now, as the hub priced it: the spot price in force (never above the
  // bid) times the cards.
  price_per_hour?: string | null;
  currency?: string;
  low_price_window?: boolean;
  warning_seconds?: number | null;
  time?: number; // the hub's clock when it answered
  preemption?: IPreemption | null;
  queued?: string | null;
  save_interval_seconds?: number | null; // open documents with changes are saved this often
}

function decimals(value: string | null | undefined): string {
  const n = Number(value);
  return value === null || value === undefined || !Number.isFinite(n) ? '?' : n.toFixed(2);
}

/** "spot CNY 0.42/h (max 0.60)"; with 2 cards "spot 2 × CNY 0.42/h (max 0.60)" (per card). */
export function spotPriceText(
  spot: ISpotStatus | null,
  gpuCount: number,
  currency: string
): string {
  if (!spot) {
    return 'spot …';
  }
  if (!spot.available) {
    return 'spot price unavailable';
  }
  const cards = gpuCount > 1 ? `${gpuCount} × ` : '';
  const max = spot.max_price ? ` (max ${decimals(spot.max_price)})` : '';
  return `spot ${cards}${formatRate(spot.price, spot.currency || currency)}${max}`;
}

/** Why the server is being reclaimed, in the user's words. */
export function reasonText(p: IPreemption, currency: string): string {
  switch (p.reason) {
    case 'price-above-max':
      return (
        `the spot price (${formatRate(p.price, currency)}) rose above your max price ` +
        `(${formatRate(p.max_price, currency)})`
      );
    case 'on-demand-reclaim':
      return 'an on-demand user needs this GPU';
    case 'low-price-window-ended':
      return 'the low-price window ended';
    case 'reserved':
      return 'this GPU is reserved (a lab session or a monthly reservation)';
    default:
      return p.reason || 'the spot market reclaims this GPU';
  }
}

/** 299.2 -> "4:59", 7 -> "0:07", 3723 -> "1:02:03"; never negative. */
export function formatCountdown(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '?';
  }
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n: number) => String(n).padStart(2, '0');
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h > 0 ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
}

/** What the checkpoint line says, or '' when the hub reported no checkpoint (yet). */
export function checkpointText(c: ICheckpoint | null | undefined): string {
  if (!c) {
    return '';
  }
  const log = c.log ? ` Output: ${c.log}` : '';
  if (c.state === 'done') {
    return `Your checkpoint command finished (exit 0).${log}`;
  }
  if (c.state === 'failed') {
    const why = c.error || `exit ${c.exit_code}`;
    return `Your checkpoint command failed (${why}).${log}`;
  }
  return 'Your checkpoint command is running.';
}

/** Something the page announces once. */
export interface ISpotEvent {
  kind: 'warning' | 'checkpoint' | 'cancelled' | 'stopped' | 'cleared';
  preemption: IPreemption;
}

/**
 * Follows the spot status the page polls and says what changed: a new warning (save every open
 * document, start the countdown), its checkpoint result, and its end (cancelled, stopped, or
 * gone without a word). Older preemptions of this server (cancelled last week) are history and
 * announce nothing.
 *
 * The countdown runs on the hub's clock: at each answer it notes the hub's `time` and the local
 * time it arrived, so a client clock that is minutes off still counts down the real time left.
 * When the hub stops answering, the countdown goes on from the last answer.
 */
export class SpotTracker {
  private active: IPreemption | null = null;
  private hubTime = 0;
  private receivedAtMs = 0;
  private checkpointKey = '';
  last: ISpotStatus | null = null;

  update(spot: ISpotStatus, receivedAtMs: number): ISpotEvent[] {
    this.last = spot;
    if (!spot.spot || !spot.available || typeof spot.time !== 'number') {
      return []; // nothing new is known: an active countdown goes on
    }
    this.hubTime = spot.time;
    this.receivedAtMs = receivedAtMs;
    const p = spot.preemption || null;
    const events: ISpotEvent[] = [];
    const active = this.active;
    if (active && (!p || p.id !== active.id || p.status !== 'warning')) {
      let kind: ISpotEvent['kind'] = 'cleared';
      if (p && p.id === active.id && (p.status === 'cancelled' || p.status === 'stopped')) {
        kind = p.status;
      }
      events.push({ kind, preemption: p && p.id === active.id ? p : active });
      this.active = null;
      this.checkpointKey = '';
    }
    if (p && p.status === 'warning') {
      if (!this.active) {
        events.push({ kind: 'warning', preemption: p });
      }
      this.active = p;
      const key = p.checkpoint ? `${p.checkpoint.state}:${p.checkpoint.exit_code}` : '';
      if (key && key !== this.checkpointKey) {
        events.push({ kind: 'checkpoint', preemption: p });
      }
      this.checkpointKey = key;
    }
    return events;
  }

  /** The warning in progress, if any. */
  get warning(): IPreemption | null {
    return this.active;
  }

  /** The hub's clock now, from its last answer and the local time elapsed since. */
  hubNow(nowMs: number): number {
    return this.hubTime + (nowMs - this.receivedAtMs) / 1000;
  }

  /** Seconds left before the server stops, or null without a warning. */
  secondsLeft(nowMs: number): number | null {
    if (!this.active) {
      return null;
    }
    return Math.max(0, this.active.deadline - this.hubNow(nowMs));
  }

  /** The deadline on the local clock (ms), to show the user "stops at 14:05:30". */
  deadlineLocalMs(): number | null {
    if (!this.active) {
      return null;
    }
    return this.receivedAtMs + (this.active.deadline - this.hubTime) * 1000;
  }

  /** Poll faster while a warning is on, so a cancellation shows within seconds. */
  pollMs(normalMs: number, warningMs: number): number {
    return this.active ? warningMs : normalMs;
  }
}

/** JupyterLab cuts a notification's text at 140 characters: the short reason. */
export function shortReason(p: IPreemption, currency: string): string {
  switch (p.reason) {
    case 'price-above-max':
      return `spot price ${formatRate(p.price, currency)} > your max ${decimals(p.max_price)}`;
    case 'on-demand-reclaim':
      return 'an on-demand user needs this GPU';
    case 'low-price-window-ended':
      return 'the low-price window ended';
    case 'reserved':
      return 'this GPU is reserved (a lab session or a monthly reservation)';
    default:
      return p.reason || 'reclaimed by the spot market';
  }
}

/** The checkpoint in a few words for the notification, or ''. */
export function shortCheckpoint(c: ICheckpoint | null | undefined): string {
  if (!c) {
    return '';
  }
  if (c.state === 'done') {
    return 'Checkpoint: done (exit 0).';
  }
  if (c.state === 'failed') {
    return `Checkpoint: failed (${c.error || `exit ${c.exit_code}`}).`;
  }
  return 'Checkpoint: running.';
}

/**
 * The notification's text during a warning (at most 140 characters, JupyterLab's limit):
 * "Spot server stops in 0:17 (spot price CNY 0.60/h > your max 0.40). All open documents
 * saved. Checkpoint: done (exit 0)."
 */
export function warningMessage(
  p: IPreemption,
  secondsLeft: number,
  currency: string,
  saveNote: string
): string {
  const when = secondsLeft > 0 ? `stops in ${formatCountdown(secondsLeft)}` : 'is stopping now';
  const head = `Spot server ${when} (${shortReason(p, currency)}).`;
  const text = [head, saveNote, shortCheckpoint(p.checkpoint)].filter(t => t).join(' ');
  return text.length <= 140 ? text : `${text.slice(0, 139)}…`;
}

/** The whole story, for the notification's "Details" and the countdown's tooltip. */
export function warningDetails(
  p: IPreemption,
  deadlineLocal: string,
  currency: string,
  saveNote: string
): string[] {
  return [
    `This spot server is reclaimed because ${reasonText(p, currency)}.`,
    `It stops at ${deadlineLocal} unless the preemption is cancelled (for a price rise: ` +
      'when the price falls back within your max price before then).',
    saveNote,
    p.signalled
      ? `${p.signalled} process(es) that asked for it (gpulab_spot.on_preempt) got SIGUSR1.`
      : '',
    checkpointText(p.checkpoint)
  ].filter(t => t);
}

/** The notification's text when the warning ends. */
export function endMessage(event: ISpotEvent, spot: ISpotStatus | null, currency: string): string {
  if (event.kind === 'cancelled') {
    const now =
      spot && spot.available && spot.price
        ? ` (spot price now ${formatRate(spot.price, spot.currency || currency)}, your max ` +
          `${formatMoney(spot.max_price, '')})`
        : '';
    return `Preemption cancelled: this server keeps running${now}.`;
  }
  if (event.kind === 'stopped') {
    return (
      'This spot server was reclaimed and stopped (open documents were saved at the warning). ' +
      'Start a new one from the hub home page.'
    );
  }
  return 'The preemption warning is over: this server keeps running.';
}

/** The status bar's tooltip lines for a spot server. */
export function spotTitle(spot: ISpotStatus | null, currency: string): string {
  if (!spot) {
    return 'Spot price: loading…';
  }
  if (!spot.available) {
    return `Spot price unavailable: ${spot.reason || 'the hub did not answer'}`;
  }
  const cur = spot.currency || currency;
  const warning = spot.warning_seconds ? formatCountdown(spot.warning_seconds) : '?';
  return (
    `Spot price: ${formatRate(spot.price, cur)} per card; your max price: ` +
    `${spot.max_price ? formatRate(spot.max_price, cur) : 'the on-demand price'}.\n` +
    `Above it the server is reclaimed after a ${warning} warning (open documents are saved).` +
    (spot.save_interval_seconds
      ? `\nOpen documents with changes are saved every ${formatCountdown(
          spot.save_interval_seconds
        )} (m:ss) while on spot.`
      : '')
  );
}

/**
 * When to save open documents with unsaved changes on a spot server: every
 * `save_interval_seconds` (the hub's `SpotMarket.save_interval`, 15 min by default), counted
 * from the page's start or the last save (the warning's save restarts it). Never on a server
 * that is not spot; while the hub does not answer, the last interval it gave goes on.
 */
export class PeriodicSave {
  private lastMs: number | null = null;
  private everyMs = 0;

  due(spot: ISpotStatus | null, nowMs: number): boolean {
    if (!spot || !spot.spot) {
      this.lastMs = null;
      this.everyMs = 0;
      return false;
    }
    if (spot.available) {
      const every = spot.save_interval_seconds;
      this.everyMs = typeof every === 'number' && every > 0 ? every * 1000 : 0;
    }
    if (!this.everyMs) {
      return false;
    }
    if (this.lastMs === null) {
      this.lastMs = nowMs;
      return false;
    }
    if (nowMs - this.lastMs >= this.everyMs) {
      this.lastMs = nowMs;
      return true;
    }
    return false;
  }

  /** A save happened (at a warning): the next periodic one is a whole interval later. */
  saved(nowMs: number): void {
    this.lastMs = nowMs;
  }
}
