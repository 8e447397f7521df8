// The spot plugin, on spot servers only: reads the spot status (price, bid, preemption) and
// provides it as IGpulabSpot (the status bar shows it); at a preemption warning it saves every
// open document and keeps a notification with the countdown, the reason and the checkpoint's
// result up to date; and it saves documents with changes every save_interval_seconds.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { getSpot } from './api';
import { IStatus } from './logic';
import {
  endMessage,
  ISpotStatus,
  PeriodicSave,
  SpotTracker,
  warningDetails,
  warningMessage
} from './spot';
import { saveDirtyDocuments, saveOpenDocuments } from './switcher';
import { IGpulabSession, IGpulabSpot } from './tokens';

/** Everything a spot server's page does, and the state it shares through IGpulabSpot. */
class SpotServer implements IGpulabSpot {
  private tracker = new SpotTracker();
  private periodic = new PeriodicSave();
  private periodicSaves = 0;
  private notice = ''; // id of the warning's notification
  private saveNote = '';
  private _secondsLeft: number | null = null;
  private _countdownTitle = '';
  private _changed = new Signal<IGpulabSpot, void>(this);

  constructor(
    private app: JupyterFrontEnd,
    private session: IGpulabSession
  ) {}

  get status(): ISpotStatus | null {
    return this.tracker.last;
  }

  get secondsLeft(): number | null {
    return this._secondsLeft;
  }

  get countdownTitle(): string {
    return this._countdownTitle;
  }

  get changed(): ISignal<IGpulabSpot, void> {
    return this._changed;
  }

  private get currency(): string {
    return this.session.status.currency;
  }

  /** Poll the spot status (faster while a warning is on) and tick every second. */
  start(): void {
    void this.loop();
    setInterval(() => this.tick(Date.now()), 1000);
  }

  private tick(now: number): void {
    if (this.tracker.warning) {
      this.showWarning(now);
      this._changed.emit();
    } else if (this.periodic.due(this.tracker.last, now)) {
      void this.periodicSave();
    }
  }

  private async loop(): Promise<void> {
    try {
      await this.poll();
    } catch (e) {
      console.warn('gpulab: spot status', e);
    }
    const status: IStatus = this.session.status;
    const normal = (status.spot_refresh_seconds || 10) * 1000;
    const fast = (status.spot_warning_refresh_seconds || 2) * 1000;
    setTimeout(() => void this.loop(), this.tracker.pollMs(normal, fast));
  }

  private async poll(): Promise<void> {
    let answer: ISpotStatus;
    try {
      answer = await getSpot();
    } catch (e) {
      answer = { spot: true, available: false, reason: (e as Error).message };
    }
    const events = this.tracker.update(answer, Date.now());
    for (const event of events) {
      this.onEvent(event.kind, endMessage(event, answer, this.currency));
    }
    this.showWarning(Date.now());
    this._changed.emit();
  }

  /** The warning's details, one per line: the countdown's tooltip and the Details dialog. */
  private details(): string[] {
    const p = this.tracker.warning;
    const deadline = this.tracker.deadlineLocalMs();
    if (!p || deadline === null) {
      return [];
    }
    const at = new Date(deadline).toLocaleTimeString();
    return warningDetails(p, at, this.currency, this.saveNote);
  }

  private showWarning(nowMs: number): void {
    const p = this.tracker.warning;
    const left = this.tracker.secondsLeft(nowMs);
    this._secondsLeft = left;
    this._countdownTitle = this.details().join('\n');
    if (!p || left === null) {
      return;
    }
    const message = warningMessage(p, left, this.currency, this.saveNote);
    const options = {
      autoClose: false as const,
      actions: [
        {
          label: 'Details',
          caption: 'Why, when, and what was saved',
          callback: (event: Event) => {
            event.preventDefault(); // keep the notification: the countdown goes on in it
            const body = document.createElement('div');
            body.className = 'jp-gpulab-confirm';
            for (const line of this.details()) {
              const para = document.createElement('p');
              para.textContent = line;
              body.appendChild(para);
            }
            void showDialog({
              title: 'Spot server preemption',
              body: new Widget({ node: body }),
              buttons: [Dialog.okButton()]
            });
          }
        }
      ]
    };
    if (!this.notice) {
      this.notice = Notification.warning(message, options);
    } else {
      Notification.update({ id: this.notice, message, type: 'warning', ...options });
    }
  }

  private onEvent(kind: string, message: string): void {
    if (kind === 'warning') {
      // Save now, while the server is still there: the deadline may come before the user.
      this.saveNote = 'Saving open documents…';
      document.body.dataset.gpulabPreemption = 'warning';
      this.periodic.saved(Date.now());
      saveOpenDocuments(this.app).then(
        () => {
          this.saveNote = 'All open documents saved.';
          document.body.dataset.gpulabPreemptionSaved = this.tracker.warning?.id || 'saved';
        },
        e => {
          this.saveNote = `Saving failed: ${(e as Error).message}`;
        }
      );
      return;
    }
    if (kind === 'checkpoint') {
      return; // the warning's text shows it at the next tick
    }
    // The warning is over: say how, and take the countdown away.
    this._secondsLeft = null;
    document.body.dataset.gpulabPreemption = kind;
    if (this.notice) {
      Notification.dismiss(this.notice);
    }
    if (kind === 'stopped') {
      Notification.error(message, { autoClose: false });
    } else {
      Notification.success(message, { autoClose: 20000 });
    }
    this.notice = '';
    this.saveNote = '';
  }

  /**
   * While on spot, open documents with changes are saved every save_interval_seconds, so a
   * reclaim (even one whose warning the page never saw) loses at most that much typing.
   */
  private async periodicSave(): Promise<void> {
    try {
      const paths = await saveDirtyDocuments(this.app);
      this.periodicSaves += 1;
      document.body.dataset.gpulabSpotSaves = String(this.periodicSaves);
      document.body.dataset.gpulabSpotSaved = paths.join('\n');
    } catch (e) {
      console.warn('gpulab: periodic save on spot failed', e);
    }
  }
}

export const spotPlugin: JupyterFrontEndPlugin<IGpulabSpot | null> = {
  id: 'jupyterlab-gpulab:spot',
  description: 'gpulab on spot servers: price and bid, preemption warning, periodic saves',
  autoStart: true,
  requires: [IGpulabSession],
  provides: IGpulabSpot,
  activate: (app: JupyterFrontEnd, session: IGpulabSession | null): IGpulabSpot | null => {
    if (!session || session.status.pricing !== 'spot') {
      return null;
    }
    const spot = new SpotServer(app, session);
    spot.start();
    return spot;
  }
};
