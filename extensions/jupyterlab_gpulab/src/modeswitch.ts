// The mode-switch plugin: the "Switch to no-GPU mode (CNY 0.09/h)", "Switch to GPU..." and
// toggle commands (in the palette; the status bar's button runs the toggle), and after a switch
// the notification saying where the page is now and how long the switch took.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';

import { getPool } from './api';
import { formatRate, gpuChoices, isNoGpu, noGpuLabel, priceChange } from './logic';
import { runSwitch, takeSwitchTiming } from './switcher';
import { CommandIDs, IGpulabSession } from './tokens';
import { GpuChooser } from './widgets';

async function switchToNoGpu(app: JupyterFrontEnd, session: IGpulabSession): Promise<void> {
  const status = session.status;
  await runSwitch(app, status, {
    request: { gpu: 'none' },
    title: 'Switch to no-GPU mode?',
    target: session.catalog?.no_gpu.display_name || 'No GPU',
    priceLine: priceChange(status.price_per_hour, session.noGpuPrice, status.currency)
  });
}

async function switchToGpu(app: JupyterFrontEnd, session: IGpulabSession): Promise<void> {
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
  const chooser = new GpuChooser(choices, session.catalog?.max_gpus_per_server || 1);
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
  const status = session.status;
  await runSwitch(app, status, {
    request: { gpu: value.choice.slug, gpus: value.gpus },
    title: `Switch to ${name} x${value.gpus}?`,
    target: `${name} x${value.gpus}`,
    priceLine: priceChange(status.price_per_hour, total, pool.currency)
  });
}

export const modeSwitchPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:mode-switch',
  description: 'gpulab: switch this server to no-GPU mode or to a GPU you choose',
  autoStart: true,
  requires: [IGpulabSession],
  optional: [ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    session: IGpulabSession | null,
    palette: ICommandPalette | null
  ): void => {
    if (!session) {
      return;
    }
    const noGpu = () => isNoGpu(session.status);
    app.commands.addCommand(CommandIDs.noGpu, {
      label: () => noGpuLabel(session.noGpuPrice || '?', session.status.currency),
      caption: 'Restart this server without a GPU (same image, datasets and home)',
      isEnabled: () => !noGpu(),
      execute: () => switchToNoGpu(app, session)
    });
    app.commands.addCommand(CommandIDs.gpu, {
      label: 'Switch to GPU...',
      caption: 'Restart this server on a GPU type you choose (shows free cards and price)',
      execute: () => switchToGpu(app, session)
    });
    app.commands.addCommand(CommandIDs.toggle, {
      label: () => (noGpu() ? 'Switch to GPU...' : 'Switch to no-GPU mode'),
      execute: () => (noGpu() ? switchToGpu(app, session) : switchToNoGpu(app, session))
    });
    if (palette) {
      for (const command of [CommandIDs.noGpu, CommandIDs.gpu]) {
        palette.addItem({ command, category: 'gpulab' });
      }
    }
    // The labels show the no-GPU price (from the catalog) and the mode (from the status).
    const changed = () => app.commands.notifyCommandChanged();
    void session.catalogLoaded.then(changed);
    session.statusChanged.connect(changed);

    // After a switch: say where we are and how long it took.
    const timing = takeSwitchTiming();
    if (timing) {
      void app.restored.then(() => {
        const status = session.status;
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
