// The session model behind IGpulabSession: status, catalog and balance, polled. No JupyterLab
// imports (the server calls come in as functions), so jest tests it without a browser.
import { ISignal, Signal } from '@lumino/signaling';

import { IBalance, ICatalog, IServerId, IStatus, newBalanceWarnings } from './logic';
import { IGpulabSession } from './tokens';

export const BALANCE_REFRESH_MS = 15000;
export const STATUS_REFRESH_MS = 60000;

/** The calls the model makes (api.ts in the page; fakes in tests). */
export interface ISessionApi {
  getStatus(): Promise<IStatus>;
  getBalance(): Promise<IBalance>;
  getCatalog(): Promise<ICatalog>;
  /** Which server process answers behind this URL (null: none). */
  pollServer(): Promise<IServerId | null>;
  /** Reload the page (another server process answers: the hub restarted this one elsewhere). */
  reload(): void;
}

export class GpulabSession implements IGpulabSession {
  private _status: IStatus;
  private _catalog: ICatalog | null = null;
  private _catalogError = '';
  private _balance: IBalance | null = null;
  private _catalogLoaded: Promise<void> | null = null;
  private warned = new Set<string>();
  private timers: ReturnType<typeof setInterval>[] = [];
  private _statusChanged = new Signal<IGpulabSession, IStatus>(this);
  private _catalogChanged = new Signal<IGpulabSession, ICatalog | null>(this);
  private _balanceChanged = new Signal<IGpulabSession, IBalance>(this);
  private _balanceWarned = new Signal<IGpulabSession, string[]>(this);

  constructor(
    status: IStatus,
    private api: ISessionApi
  ) {
    this._status = status;
  }

  /**
   * The session of this server, or null when this server is not gpulab's (its status says so,
   * or the server extension does not answer).
   */
  static async create(api: ISessionApi): Promise<GpulabSession | null> {
    let status: IStatus;
    try {
      status = await api.getStatus();
    } catch (e) {
      console.warn('gpulab: server extension not answering; extension inactive', e);
      return null;
    }
    if (!status.gpulab) {
      console.info('gpulab: this server was not started by gpulab; extension inactive');
      return null;
    }
    return new GpulabSession(status, api);
  }

  get status(): IStatus {
    return this._status;
  }

  get catalog(): ICatalog | null {
    return this._catalog;
  }

  get catalogError(): string {
    return this._catalogError;
  }

  get catalogLoaded(): Promise<void> {
    return this._catalogLoaded || this.loadCatalog();
  }

  get balance(): IBalance | null {
    return this._balance;
  }

  /** No-GPU mode's price for this user, as the hub answers it (a student's: education). */
  get noGpuPrice(): string | null {
    if (!this._catalog) {
      return null;
    }
    const yours = this._catalog.your_prices?.no_gpu;
    return yours ? yours.price_per_hour : this._catalog.no_gpu.price_per_hour;
  }

  get statusChanged(): ISignal<IGpulabSession, IStatus> {
    return this._statusChanged;
  }

  get catalogChanged(): ISignal<IGpulabSession, ICatalog | null> {
    return this._catalogChanged;
  }

  get balanceChanged(): ISignal<IGpulabSession, IBalance> {
    return this._balanceChanged;
  }

  get balanceWarned(): ISignal<IGpulabSession, string[]> {
    return this._balanceWarned;
  }

  /** Read the catalog (once: later calls answer the same promise). */
  loadCatalog(): Promise<void> {
    if (!this._catalogLoaded) {
      this._catalogLoaded = this.api.getCatalog().then(
        catalog => {
          this._catalog = catalog;
          this._catalogChanged.emit(catalog);
        },
        e => {
          this._catalogError = `Catalog unavailable: ${(e as Error).message}`;
          this._catalogChanged.emit(null);
        }
      );
    }
    return this._catalogLoaded;
  }

  /** Read the balance; billing not answering reads as {available: false, reason}. */
  async refreshBalance(): Promise<void> {
    let balance: IBalance;
    try {
      balance = await this.api.getBalance();
    } catch (e) {
      balance = { available: false, reason: (e as Error).message };
    }
    this._balance = balance;
    this._balanceChanged.emit(balance);
    const warnings = newBalanceWarnings(balance, this._status.low_balance_minutes, this.warned);
    if (warnings.length) {
      this._balanceWarned.emit(warnings);
    }
  }

  /**
   * Read the status again. Another server process behind our URL means the hub restarted us
   * elsewhere (e.g. moved to no-GPU mode when the balance ran out): reload so the whole page
   * matches it. No answer (the server is restarting) changes nothing: the next refresh or the
   * switch flow handles it.
   */
  async refreshStatus(): Promise<void> {
    try {
      const answer = await this.api.pollServer();
      if (answer && answer.server_id && answer.server_id !== this._status.server_id) {
        this.api.reload();
        return;
      }
      this._status = await this.api.getStatus();
      this._statusChanged.emit(this._status);
    } catch {
      // the server is restarting
    }
  }

  /** Load the catalog and the balance now, then poll the balance and the status. */
  start(balanceMs = BALANCE_REFRESH_MS, statusMs = STATUS_REFRESH_MS): void {
    if (this.timers.length) {
      return;
    }
    this.timers.push(
      setInterval(() => void this.refreshBalance(), balanceMs),
      setInterval(() => void this.refreshStatus(), statusMs)
    );
    void this.refreshBalance();
    void this.loadCatalog();
  }

  /** Stop polling. */
  stop(): void {
    for (const timer of this.timers) {
      clearInterval(timer);
    }
    this.timers = [];
  }
}
