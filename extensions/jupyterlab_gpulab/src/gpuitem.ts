// The GPU plugin: this server's cards as the hub measures them, in the status bar ("GPU 37% ·
// 1.2/80 GiB", amber "GPU idle 8 min" once the hub nudges) and in the GPU panel (gpupanel.ts),
// and the hub's idle nudge as a notification whose button runs the existing no-GPU switch (its
// own confirmation dialog with the price change). One poll feeds both: every 5 s while the page
// is seen, once a minute while the tab is hidden, slower after failures. The figures come through
// this server's extension (GET gpulab/api/gpu-usage), which asks the hub with the server's token.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { getGpuUsage } from './api';
import { GpuUsagePanel } from './gpupanel';
import {
  gpuItemText,
  gpuItemTitle,
  IGpuUsage,
  isUnavailable,
  NudgeEpisodes,
  pollDelay
} from './gpuusage';
import { CommandIDs, IGpulabSession } from './tokens';

export class GpuItem extends Widget {
  readonly activeChanged = new Signal<this, void>(this);
  private active = false;

  constructor(
    onClick: () => void,
    private typeName: (slug: string) => string = slug => slug
  ) {
    super();
    this.addClass('jp-gpulab-gpu-item');
    this.node.setAttribute('role', 'status');
    this.node.addEventListener('click', () => onClick());
  }

  get isActive(): boolean {
    return this.active;
  }

  render(usage: IGpuUsage): void {
    const text = gpuItemText(usage);
    this.node.textContent = text;
    this.node.title = text ? gpuItemTitle(usage, this.typeName) : '';
    this.node.dataset.idle = usage.nudge ? 'nudge' : 'no';
    this.toggleClass('jp-gpulab-gpu-idle', !!usage.nudge);
    if (this.active !== !!text) {
      this.active = !!text; // no cards (no-GPU mode): the item leaves the status bar
      this.activeChanged.emit();
    }
  }
}

export const gpuUsagePlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:gpus',
  description:
    "gpulab: this server's GPUs as the hub measures them (status bar and panel), and a nudge " +
    'with the prices when they sit idle',
  autoStart: true,
  requires: [IGpulabSession, IStatusBar],
  activate: (app: JupyterFrontEnd, session: IGpulabSession | null, statusBar: IStatusBar) => {
    if (!session) {
      return;
    }
    const episodes = new NudgeEpisodes();
    let shownId = '';
    let last: IGpuUsage | null = null;
    const switchToNoGpu = () => {
      if (app.commands.hasCommand(CommandIDs.noGpu)) {
        void app.commands.execute(CommandIDs.noGpu);
      }
    };
    const dismiss = () => {
      panel.dismissed = true;
      if (shownId) {
        Notification.dismiss(shownId);
        shownId = '';
      }
      render();
    };
    const typeName = (slug: string) => session.catalog?.gpu_types[slug]?.display_name || slug;
    const panel = new GpuUsagePanel({
      refresh: () => void poll(),
      switchToNoGpu,
      dismiss,
      typeName
    });
    app.shell.add(panel, 'left', { rank: 710 });
    const item = new GpuItem(() => app.shell.activateById(panel.id), typeName);
    item.id = 'gpulab-gpu-status';
    statusBar.registerStatusItem('jupyterlab-gpulab:gpu', {
      item,
      align: 'left',
      rank: -6,
      isActive: () => item.isActive,
      activeStateChanged: item.activeChanged
    });
    // The toast closed by its own "x" counts as a dismissal of this episode's nudge.
    Notification.manager.changed.connect((_, change) => {
      if (change.type === 'removed' && shownId && change.notification.id === shownId) {
        shownId = '';
        panel.dismissed = true;
        render();
      }
    });

    function render(error = ''): void {
      panel.render(last, session!.status.mode, error);
    }

    function announce(usage: IGpuUsage): void {
      const step = episodes.next(usage);
      if (step === 'show' && usage.nudge) {
        panel.dismissed = false;
        shownId = Notification.warning(usage.nudge.text, {
          autoClose: false,
          actions: [
            {
              label: 'Switch to no-GPU mode…',
              caption: 'Restart this server without a GPU (same image, datasets and home)',
              displayType: 'accent',
              callback: () => {
                shownId = '';
                switchToNoGpu();
              }
            },
            { label: 'Dismiss', callback: () => dismiss() }
          ]
        });
      } else if (step === 'end') {
        panel.dismissed = false;
        if (shownId) {
          const id = shownId;
          shownId = ''; // withdrawn by the hub, not dismissed by the person
          Notification.dismiss(id);
        }
      }
    }

    let failures = 0;
    let timer: number | undefined;
    let inFlight = false;
    async function poll(): Promise<void> {
      if (inFlight) {
        return;
      }
      inFlight = true;
      window.clearTimeout(timer);
      try {
        const answer = await getGpuUsage();
        if (isUnavailable(answer)) {
          failures += 1;
          render(answer.message);
        } else {
          failures = 0;
          last = answer;
          item.render(answer);
          announce(answer);
          render();
        }
      } catch (e) {
        failures += 1; // the server is away (a restart): keep the last figures
      } finally {
        inFlight = false;
        timer = window.setTimeout(
          () => void poll(),
          pollDelay(document.visibilityState === 'visible', failures)
        );
      }
    }
    // Back on the tab: fresh figures now rather than at the hidden tab's slow pace.
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') {
        void poll();
      }
    });
    void poll();
  }
};
