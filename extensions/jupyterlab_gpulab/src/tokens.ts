// What gpulab's plugins share: the session model (IGpulabSession), the spot server's state
// (IGpulabSpot) and the command ids. Each feature is its own plugin (see index.ts) and reaches
// the others only through these.
import { Token } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';

import { IBalance, ICatalog, IStatus } from './logic';
import { ISpotStatus } from './spot';

/**
 * This server's gpulab session: its status (mode, price, datasets, ...), the catalog, and the
 * billing balance, each kept fresh by polling and announced by a signal.
 *
 * The plugin providing it resolves to `null` when this server was not started by gpulab (or its
 * server extension does not answer); every gpulab plugin then stays inactive.
 */
export interface IGpulabSession {
  /** The last status read; replaced (not mutated) at each refresh. */
  readonly status: IStatus;
  /** The hub's catalog once loaded; null before, or when it could not be read. */
  readonly catalog: ICatalog | null;
  /** Why the catalog could not be read ('' while loading or once loaded). */
  readonly catalogError: string;
  /** Resolves once the catalog was read or failed (catalog or catalogError is then set). */
  readonly catalogLoaded: Promise<void>;
  /** The last balance read from billing; null before the first answer. */
  readonly balance: IBalance | null;
  /** The no-GPU mode's price per hour, from the catalog (null before it is loaded). */
  readonly noGpuPrice: string | null;
  /** A new status was read (every minute). */
  readonly statusChanged: ISignal<IGpulabSession, IStatus>;
  /** The catalog was loaded, or failed to load. */
  readonly catalogChanged: ISignal<IGpulabSession, ICatalog | null>;
  /** A new balance was read (every 15 s), or billing did not answer ({available: false}). */
  readonly balanceChanged: ISignal<IGpulabSession, IBalance>;
  /** Low-balance warnings not announced before, with the balance that raised them. */
  readonly balanceWarned: ISignal<IGpulabSession, string[]>;
}

export const IGpulabSession = new Token<IGpulabSession | null>(
  'jupyterlab-gpulab:IGpulabSession',
  "This server's gpulab session: status, catalog and billing balance, polled, with signals; " +
    'null when the server was not started by gpulab.'
);

/**
 * A spot server's state as the page follows it: the spot price and bid, and the preemption
 * countdown while a warning is on. The plugin providing it resolves to `null` on an on-demand
 * server (and outside gpulab).
 */
export interface IGpulabSpot {
  /** The last spot status read; null before the first answer. */
  readonly status: ISpotStatus | null;
  /** Seconds before a preemption stops this server; null without a warning. */
  readonly secondsLeft: number | null;
  /** The warning's details, one per line ('' without a warning): the countdown's tooltip. */
  readonly countdownTitle: string;
  /** Any of the above changed (each spot answer, and every second while a warning is on). */
  readonly changed: ISignal<IGpulabSpot, void>;
}

export const IGpulabSpot = new Token<IGpulabSpot | null>(
  'jupyterlab-gpulab:IGpulabSpot',
  "A spot server's price, bid and preemption countdown; null on an on-demand server."
);

/** The commands gpulab adds; the status bar and the Datasets panel run them. */
export namespace CommandIDs {
  export const noGpu = 'gpulab:switch-no-gpu';
  export const gpu = 'gpulab:switch-gpu';
  export const toggle = 'gpulab:toggle-gpu';
  export const mount = 'gpulab:mount-dataset';
  export const openDataset = 'gpulab:open-dataset';
}
