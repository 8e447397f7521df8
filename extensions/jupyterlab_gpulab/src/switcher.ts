// The restart flow shared by the no-GPU toggle, "Switch to GPU..." and dataset mounts:
// confirm (with the price change) -> save every open document -> ask the hub (through this
// server) -> show progress -> wait for the new server -> reload into it.
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { ApiError, ISwitchRequest, pollServer, postSwitch } from './api';
import { IStatus, waitForNewServer } from './logic';

const T0_KEY = 'gpulab-switch-started';
const TARGET_KEY = 'gpulab-switch-target';

export interface ISwitchPlan {
  request: ISwitchRequest;
  title: string; // "Switch to no-GPU mode?"
  target: string; // "No GPU", "A100-80G x1", "same mode with dataset X"
  priceLine: string; // from priceChange()
}

class Progress {
  private node: HTMLDivElement;
  private step: HTMLDivElement;

  constructor(title: string) {
    this.node = document.createElement('div');
    this.node.className = 'jp-gpulab-progress';
    this.node.setAttribute('role', 'status');
    const box = document.createElement('div');
    box.className = 'jp-gpulab-progress-box';
    const h = document.createElement('div');
    h.className = 'jp-gpulab-progress-title';
    h.textContent = title;
    this.step = document.createElement('div');
    this.step.className = 'jp-gpulab-progress-step';
    box.append(h, this.step);
    this.node.appendChild(box);
    document.body.appendChild(this.node);
  }

  set(text: string): void {
    this.step.textContent = text;
  }

  addLink(href: string, text: string): void {
    const link = document.createElement('a');
    link.href = href;
    link.textContent = text;
    this.step.after(link);
  }

  dispose(): void {
    this.node.remove();
  }
}

/**
 * Save every open document that has unsaved changes (what a restart or a preemption would
 * lose). Used before a switch and at a spot preemption warning.
 */
export async function saveOpenDocuments(app: JupyterFrontEnd): Promise<void> {
  await app.commands.execute('docmanager:save-all');
}

/** A document's context, as far as saving goes (DocumentWidget.context). */
interface ISavable {
  context?: {
    path: string;
    model?: { dirty?: boolean; readOnly?: boolean };
    contentsModel?: { writable?: boolean } | null;
    save(): Promise<void>;
  };
}

/**
 * Save the open documents that have unsaved changes (and only those: a document without
 * changes is not rewritten, so a file changed on disk meanwhile is not overwritten). Returns
 * the paths saved.
 */
export async function saveDirtyDocuments(app: JupyterFrontEnd): Promise<string[]> {
  const saves: Promise<string>[] = [];
  const seen = new Set<string>();
  for (const widget of app.shell.widgets('main')) {
    const context = (widget as unknown as ISavable).context;
    if (!context || !context.model || seen.has(context.path)) {
      continue;
    }
    seen.add(context.path);
    if (context.model.dirty && !context.model.readOnly && context.contentsModel?.writable !== false) {
      saves.push(context.save().then(() => context.path));
    }
  }
  return Promise.all(saves);
}

export async function runSwitch(
  app: JupyterFrontEnd,
  status: IStatus,
  plan: ISwitchPlan
): Promise<boolean> {
  const body = document.createElement('div');
  body.className = 'jp-gpulab-confirm';
  for (const text of [
    plan.priceLine,
    'JupyterLab restarts on a new server with the same image, datasets and home folder: ' +
      'your files stay, running kernels stop (variables in memory are lost).',
    'Every open document is saved first.'
  ]) {
    const p = document.createElement('p');
    p.textContent = text;
    body.appendChild(p);
  }
  const answer = await showDialog({
    title: plan.title,
    body: new Widget({ node: body }),
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Switch' })]
  });
  if (!answer.button.accept) {
    return false;
  }
  const t0 = Date.now();
  const progress = new Progress(`Moving to ${plan.target}`);
  progress.set('Saving open documents…');
  try {
    await saveOpenDocuments(app);
  } catch (e) {
    progress.dispose();
    await showErrorMessage(
      'Nothing was changed',
      `Could not save every open document: ${(e as Error).message}`
    );
    return false;
  }
  progress.set('Asking the hub to restart this server…');
  try {
    await postSwitch(plan.request);
  } catch (e) {
    if (e instanceof ApiError && e.answered) {
      // The hub (or this server) refused: nothing was changed, and the message says why.
      progress.dispose();
      await showErrorMessage('Nothing was changed', e.message);
      return false;
    }
    // No answer from this server (a dropped connection, or the proxy's error page for it): a
    // refusal would have been answered, so the server went down with the restart.
    progress.set('This server stopped before it answered; waiting for the new one…');
  }
  sessionStorage.setItem(T0_KEY, String(t0));
  sessionStorage.setItem(TARGET_KEY, plan.target);
  try {
    await waitForNewServer({
      fetchServer: pollServer,
      oldServerId: status.server_id,
      onTick: () =>
        progress.set(`Restarting on ${plan.target}… ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    });
  } catch (e) {
    progress.set(
      `The new server did not come up (${(e as Error).message}). ` +
        'Open the hub home page to see what happened.'
    );
    progress.addLink(URLExt.join(PageConfig.getOption('hubPrefix') || '/hub/', 'home'), 'Hub home');
    return false;
  }
  progress.set('Reloading into the new server…');
  window.location.reload();
  return true;
}

/** After the reload: how long the switch took (click to usable JupyterLab), once. */
export function takeSwitchTiming(): { startedMs: number; target: string } | null {
  const started = sessionStorage.getItem(T0_KEY);
  const target = sessionStorage.getItem(TARGET_KEY) || '';
  sessionStorage.removeItem(T0_KEY);
  sessionStorage.removeItem(TARGET_KEY);
  if (!started) {
    return null;
  }
  return { startedMs: Number(started), target };
}
