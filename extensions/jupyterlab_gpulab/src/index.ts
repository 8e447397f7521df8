// gpulab inside JupyterLab: status bar (mode, price, cost, balance; spot price, bid and the
// preemption countdown on spot servers), no-GPU toggle and "Switch to GPU..." commands, the
// Datasets panel and the GPU panel.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { getBalance, getCatalog, getGpus, getPool, getSpot, getStatus, pollServer } from './api';
import {
  datasetsAfter,
  formatRate,
  gpuChoices,
  IBalance,
  ICatalog,
  IGpuChoice,
  IStatus,
  isNoGpu,
  newBalanceWarnings,
  noGpuLabel,
  priceChange
} from './logic';
import {
  endMessage,
  ISpotStatus,
  PeriodicSave,
  SpotTracker,
  warningDetails,
  warningMessage
} from './spot';
import { earlyLauncherPlugin } from './launcher';
import { runSwitch, saveDirtyDocuments, saveOpenDocuments, takeSwitchTiming } from './switcher';
import { DatasetsPanel, GpuPanel, StatusItem } from './widgets';

const BALANCE_REFRESH_MS = 15000;
const STATUS_REFRESH_MS = 60000;
const GPU_REFRESH_MS = 2000;

namespace CommandIDs {
  export const noGpu = 'gpulab:switch-no-gpu';
  export const gpu = 'gpulab:switch-gpu';
  export const toggle = 'gpulab:toggle-gpu';
  export const mount = 'gpulab:mount-dataset';
  export const openDataset = 'gpulab:open-dataset';
}

/** The body of the "Switch to GPU..." dialog: GPU type (with free cards and price) and count. */
class GpuChooser extends Widget {
  private type = document.createElement('select');
  private count = document.createElement('select');

  constructor(
    private choices: IGpuChoice[],
    private maxGpus: number
  ) {
    super();
    this.addClass('jp-gpulab-chooser');
    const typeLabel = document.createElement('label');
    typeLabel.textContent = 'GPU type';
    for (const c of choices) {
      const option = document.createElement('option');
      option.value = c.slug;
      option.textContent = c.label;
      option.disabled = c.disabled;
      this.type.appendChild(option);
    }
    const first = choices.find(c => !c.disabled);
    if (first) {
      this.type.value = first.slug;
    }
    this.type.className = 'jp-gpulab-choose-type';
    const countLabel = document.createElement('label');
    countLabel.textContent = 'Cards';
    this.count.className = 'jp-gpulab-choose-count';
    this.type.addEventListener('change', () => this.fillCounts());
    typeLabel.appendChild(this.type);
    countLabel.appendChild(this.count);
    this.node.append(typeLabel, countLabel);
    this.fillCounts();
  }

  private fillCounts(): void {
    const choice = this.choices.find(c => c.slug === this.type.value);
    this.count.replaceChildren();
    const n = Math.max(1, Math.min(choice ? choice.free : 1, this.maxGpus));
    for (let i = 1; i <= n; i++) {
      const option = document.createElement('option');
      option.value = String(i);
      option.textContent = String(i);
      this.count.appendChild(option);
    }
  }

  getValue(): { choice: IGpuChoice; gpus: number } | null {
    const choice = this.choices.find(c => c.slug === this.type.value);
    return choice ? { choice, gpus: Number(this.count.value || 1) } : null;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:plugin',
  description: 'gpulab: mode, price, balance, no-GPU toggle, datasets and GPU panels',
  autoStart: true,
  requires: [IStatusBar],
  optional: [ICommandPalette, IDefaultFileBrowser],
  activate: async (
    app: JupyterFrontEnd,
    statusBar: IStatusBar,
    palette: ICommandPalette | null,
    fileBrowser: IDefaultFileBrowser | null
  ) => {
    let status: IStatus;
    try {
      status = await getStatus();
    } catch (e) {
      console.warn('gpulab: server extension not answering; extension inactive', e);
      return;
    }
    if (!status.gpulab) {
      console.info('gpulab: this server was not started by gpulab; extension inactive');
      return;
    }
    let catalog: ICatalog | null = null;
    let catalogError = '';
    const warned = new Set<string>();

    // ---- switching -------------------------------------------------------------------------
    const noGpuPrice = () => (catalog ? catalog.no_gpu.price_per_hour : null);

    async function switchToNoGpu(): Promise<void> {
      await runSwitch(app, status, {
        request: { gpu: 'none' },
        title: 'Switch to no-GPU mode?',
        target: catalog?.no_gpu.display_name || 'No GPU',
        priceLine: priceChange(status.price_per_hour, noGpuPrice(), status.currency)
      });
    }

    async function switchToGpu(): Promise<void> {
      let pool;
      try {
        pool = await getPool();
      } catch (e) {
        await showErrorMessage('Cannot list GPUs', (e as Error).message);
        return;
      }
      const choices = gpuChoices(pool);
      if (!choices.some(c => !c.disabled)) {
        const summary = choices.map(c => c.label).join('\n') || 'This node has no GPUs.';
        await showErrorMessage(
          'No GPU is free right now',
          `${summary}\n\nNothing was changed; try again later.`
        );
        return;
      }
      const chooser = new GpuChooser(choices, catalog?.max_gpus_per_server || 1);
      const answer = await showDialog({
        title: 'Switch to GPU…',
        body: chooser,
        buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Next' })]
      });
      const value = answer.value;
      if (!answer.button.accept || !value) {
        return;
      }
      const total = (Number(value.choice.price) * value.gpus).toFixed(2);
      const name = pool.gpu_types.find(t => t.slug === value.choice.slug)?.display_name;
      await runSwitch(app, status, {
        request: { gpu: value.choice.slug, gpus: value.gpus },
        title: `Switch to ${name} x${value.gpus}?`,
        target: `${name} x${value.gpus}`,
        priceLine: priceChange(status.price_per_hour, total, pool.currency)
      });
    }

    async function mountDataset(slug: string, mount: boolean): Promise<void> {
      const name = catalog?.datasets[slug]?.display_name || slug;
      await runSwitch(app, status, {
        request: { datasets: datasetsAfter(status.datasets, slug, mount) },
        title: mount ? `Mount ${name}?` : `Unmount ${name}?`,
        target: `${status.mode} ${mount ? 'with' : 'without'} ${name}`,
        priceLine: priceChange(status.price_per_hour, status.price_per_hour, status.currency)
      });
    }

    app.commands.addCommand(CommandIDs.noGpu, {
      label: () => noGpuLabel(noGpuPrice() || '?', status.currency),
      caption: 'Restart this server without a GPU (same image, datasets and home)',
      isEnabled: () => !isNoGpu(status),
      execute: switchToNoGpu
    });
    app.commands.addCommand(CommandIDs.gpu, {
      label: 'Switch to GPU...',
      caption: 'Restart this server on a GPU type you choose (shows free cards and price)',
      execute: switchToGpu
    });
    app.commands.addCommand(CommandIDs.toggle, {
      label: () => (isNoGpu(status) ? 'Switch to GPU...' : 'Switch to no-GPU mode'),
      execute: () => (isNoGpu(status) ? switchToGpu() : switchToNoGpu())
    });
    app.commands.addCommand(CommandIDs.mount, {
      label: args => `${args.mount ? 'Mount' : 'Unmount'} dataset ${args.slug}`,
      execute: args => mountDataset(String(args.slug), !!args.mount)
    });
    app.commands.addCommand(CommandIDs.openDataset, {
      label: args => `Open dataset ${args.slug} in the file browser`,
      execute: async args => {
        const path = `datasets/${args.slug}`;
        await app.restored;
        await fileBrowser?.model.restored;
        await app.commands.execute('filebrowser:go-to-path', { path });
        if (!fileBrowser) {
          return;
        }
        // Right after a reload the file browser may still be restoring its saved folder, which
        // moves it away again; keep the requested folder for the next two seconds.
        const model = fileBrowser.model;
        for (let i = 0; i < 20; i++) {
          await new Promise(r => setTimeout(r, 100));
          if (model.path !== path) {
            await model.cd(`/${path}`);
          }
        }
      }
    });
    if (palette) {
      for (const command of [CommandIDs.noGpu, CommandIDs.gpu]) {
        palette.addItem({ command, category: 'gpulab' });
      }
    }

    // ---- status bar ------------------------------------------------------------------------
    const item = new StatusItem(() => void app.commands.execute(CommandIDs.toggle));
    item.id = 'gpulab-status';
    item.status = status;
    statusBar.registerStatusItem('jupyterlab-gpulab:status', {
      item,
      align: 'left',
      rank: -10
    });
    item.render();

    async function refreshBalance(): Promise<void> {
      let balance: IBalance;
      try {
        balance = await getBalance();
      } catch (e) {
        balance = { available: false, reason: (e as Error).message };
      }
      item.balance = balance;
      item.render();
      for (const message of newBalanceWarnings(balance, status.low_balance_minutes, warned)) {
        Notification.warning(message, { autoClose: false });
      }
    }

    async function refreshStatus(): Promise<void> {
      // Another server process behind our URL means the hub restarted us elsewhere (e.g. moved
      // to no-GPU mode when the balance ran out): reload so the whole page matches it.
      try {
        const answer = await pollServer();
        if (answer && answer.server_id && answer.server_id !== status.server_id) {
          window.location.reload();
          return;
        }
        status = await getStatus();
        item.status = status;
        app.commands.notifyCommandChanged();
      } catch {
        // the server is restarting; the next refresh or the switch flow handles it
      }
    }

    // ---- spot servers: price, bid, and the preemption warning --------------------------------
    const spot = new SpotTracker();
    const periodic = new PeriodicSave();
    let periodicSaves = 0;
    let notice = ''; // id of the warning's notification
    let saveNote = '';

    function details(): string[] {
      const p = spot.warning;
      const deadline = spot.deadlineLocalMs();
      if (!p || deadline === null) {
        return [];
      }
      const at = new Date(deadline).toLocaleTimeString();
      return warningDetails(p, at, status.currency, saveNote);
    }

    function showWarning(nowMs: number): void {
      const p = spot.warning;
      const left = spot.secondsLeft(nowMs);
      item.secondsLeft = left;
      item.countdownTitle = details().join('\n');
      if (!p || left === null) {
        return;
      }
      const message = warningMessage(p, left, status.currency, saveNote);
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
              for (const line of details()) {
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
      if (!notice) {
        notice = Notification.warning(message, options);
      } else {
        Notification.update({ id: notice, message, type: 'warning', ...options });
      }
    }

    function onSpotEvent(kind: string, message: string): void {
      if (kind === 'warning') {
        // Save now, while the server is still there: the deadline may come before the user.
        saveNote = 'Saving open documents…';
        document.body.dataset.gpulabPreemption = 'warning';
        periodic.saved(Date.now());
        saveOpenDocuments(app).then(
          () => {
            saveNote = 'All open documents saved.';
            document.body.dataset.gpulabPreemptionSaved = spot.warning?.id || 'saved';
          },
          e => {
            saveNote = `Saving failed: ${(e as Error).message}`;
          }
        );
        return;
      }
      if (kind === 'checkpoint') {
        return; // the warning's text shows it at the next tick
      }
      // The warning is over: say how, and take the countdown away.
      item.secondsLeft = null;
      document.body.dataset.gpulabPreemption = kind;
      if (notice) {
        Notification.dismiss(notice);
      }
      if (kind === 'stopped') {
        Notification.error(message, { autoClose: false });
      } else {
        Notification.success(message, { autoClose: 20000 });
      }
      notice = '';
      saveNote = '';
    }

    async function pollSpot(): Promise<void> {
      let answer: ISpotStatus;
      try {
        answer = await getSpot();
      } catch (e) {
        answer = { spot: true, available: false, reason: (e as Error).message };
      }
      const events = spot.update(answer, Date.now());
      item.spot = answer;
      for (const event of events) {
        onSpotEvent(event.kind, endMessage(event, answer, status.currency));
      }
      showWarning(Date.now());
      item.render();
    }

    async function spotLoop(): Promise<void> {
      try {
        await pollSpot();
      } catch (e) {
        console.warn('gpulab: spot status', e);
      }
      const normal = (status.spot_refresh_seconds || 10) * 1000;
      const fast = (status.spot_warning_refresh_seconds || 2) * 1000;
      setTimeout(spotLoop, spot.pollMs(normal, fast));
    }

    if (status.pricing === 'spot') {
      void spotLoop();
    }

    // While on spot, open documents with changes are saved every save_interval_seconds, so
    // a reclaim (even one whose warning the page never saw) loses at most that much typing.
    async function periodicSave(): Promise<void> {
      try {
        const paths = await saveDirtyDocuments(app);
        periodicSaves += 1;
        document.body.dataset.gpulabSpotSaves = String(periodicSaves);
        document.body.dataset.gpulabSpotSaved = paths.join('\n');
      } catch (e) {
        console.warn('gpulab: periodic save on spot failed', e);
      }
    }

    setInterval(() => {
      const now = Date.now();
      if (spot.warning) {
        showWarning(now);
      } else if (periodic.due(spot.last, now)) {
        void periodicSave();
      }
      item.render();
    }, 1000);
    setInterval(refreshBalance, BALANCE_REFRESH_MS);
    setInterval(refreshStatus, STATUS_REFRESH_MS);
    void refreshBalance();

    // ---- panels ----------------------------------------------------------------------------
    const datasets = new DatasetsPanel({
      mount: (slug, mount) => void app.commands.execute(CommandIDs.mount, { slug, mount }),
      open: slug => void app.commands.execute(CommandIDs.openDataset, { slug })
    });
    app.shell.add(datasets, 'left', { rank: 700 });
    datasets.render(null, status);
    getCatalog()
      .then(c => {
        catalog = c;
        app.commands.notifyCommandChanged();
      })
      .catch(e => {
        catalogError = `Catalog unavailable: ${(e as Error).message}`;
      })
      .finally(() => datasets.render(catalog, status, catalogError));

    const gpus = new GpuPanel(() => void refreshGpus());
    app.shell.add(gpus, 'left', { rank: 710 });
    async function refreshGpus(): Promise<void> {
      try {
        gpus.render(await getGpus());
      } catch (e) {
        gpus.render(null, (e as Error).message);
      }
    }
    void refreshGpus();
    setInterval(() => {
      if (gpus.isVisible) {
        void refreshGpus();
      }
    }, GPU_REFRESH_MS);

    // ---- after a switch: say where we are and how long it took -----------------------------
    const timing = takeSwitchTiming();
    if (timing) {
      void app.restored.then(() => {
        const seconds = ((Date.now() - timing.startedMs) / 1000).toFixed(1);
        document.body.dataset.gpulabSwitchSeconds = seconds;
        Notification.success(
          `Now on ${status.mode} (${formatRate(status.price_per_hour, status.currency)}); ` +
            `switched in ${seconds} s.`,
          { autoClose: 8000 }
        );
      });
    }
  }
};

export default [plugin, earlyLauncherPlugin];
