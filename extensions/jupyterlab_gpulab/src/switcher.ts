// The restart flow shared by the no-GPU toggle, "Switch to GPU..." and dataset mounts:
// confirm (with the price change) -> save every open document -> ask the hub (through this
// server) -> leave this page for the hub's own progress page, which comes back to the same
// JupyterLab URL once the hub says the new server is ready.
//
// Why leave: while the server restarts, every poller of this page (JupyterLab's kernels,
// sessions, contents and terminals, and ours) would hit the proxy for a server that is not
// there (a 503 each), and a page reloaded on the first answer of the new process could come
// up before its contents API did (an empty file browser). The hub's page polls nothing of
// this server; it follows the hub's progress events and redirects only when the hub has
// routed the new server.
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { ApiError, ISwitchRequest, postSwitch } from './api';
import { IStatus } from './logic';

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
  // This page lets go of the server before it asks: the kernels' websockets and the pollers
  // (JupyterLab's and ours) are closed now, so that they have finished closing when the server
  // stops; closed under a stopping server they fail in the console and reconnect to it.
  quiet(app);
  try {
    await postSwitch(plan.request);
  } catch (e) {
    if (e instanceof ApiError && e.answered) {
      // The hub (or this server) refused: nothing was changed, and the message says why. The
      // page reconnects to the same server (its kernels kept running) by loading again.
      progress.dispose();
      await showErrorMessage('Nothing was changed', e.message);
      window.location.reload();
      return false;
    }
    // No answer from this server (a dropped connection, or the proxy's error page for it): a
    // refusal would have been answered, so the server went down with the restart.
    progress.set('This server stopped before it answered; waiting for the new one…');
  }
  sessionStorage.setItem(T0_KEY, String(t0));
  sessionStorage.setItem(TARGET_KEY, plan.target);
  progress.set(`Restarting on ${plan.target}; the hub shows the progress…`);
  window.location.assign(restartPageUrl());
  return true;
}

/** Close this page's connections to the server (kernels, sessions, contents, terminals). */
function quiet(app: JupyterFrontEnd): void {
  try {
    app.serviceManager.dispose();
  } catch {
    // The page is left either way; a connection that did not close ends with it.
  }
}

/**
 * The hub's page that follows this server's restart (JupyterHub's spawn-pending page: the
 * stop, then the spawn's progress events) and then redirects to `next`: this very JupyterLab
 * URL, so the same documents and layout come back. On the hub's origin, which may differ from
 * this server's (users on subdomains): then `next` is absolute, which the hub accepts for its
 * users' hosts only.
 */
export function restartPageUrl(
  location: { origin: string; pathname: string; search: string; hash: string } = window.location,
  option: (name: string) => string = PageConfig.getOption
): string {
  const hubHost = option('hubHost') || '';
  const hubPrefix = option('hubPrefix') || '/hub/';
  const user = option('hubUser');
  const server = option('hubServerName') || '';
  // The hub adds `redirects=N` to a URL it redirects to (its loop guard): not carried along.
  const query = new URLSearchParams(location.search);
  query.delete('redirects');
  const search = query.toString() ? `?${query}` : '';
  const here = `${location.pathname}${search}${location.hash}`;
  if (!user) {
    // Not started by a hub (a bare jupyter lab): nothing to follow but this page.
    return here;
  }
  const page = URLExt.join(
    hubHost,
    hubPrefix,
    'spawn-pending',
    encodeURIComponent(user),
    ...(server ? [encodeURIComponent(server)] : [])
  );
  const next = hubHost ? `${location.origin}${here}` : here;
  return `${page}?next=${encodeURIComponent(next)}`;
}

/** After the return to JupyterLab: how long the switch took (click to usable JupyterLab), once. */
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
