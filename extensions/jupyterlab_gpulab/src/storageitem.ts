// The home's usage in the status bar: "Home 12.3 / 50 GB", amber from 80 %, red from 95 %, and a
// notification once per level per session (the hub's own notice). It reads the storage figure
// through this server's extension (GET gpulab/api/storage), which asks the hub with the server's
// token: that token may read its own user's figure and nothing more (it cannot change a quota).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { getStorage } from './api';
import { IStorage, storageLevel, StorageNotices, storageText, storageTitle } from './storage';
import { IGpulabSession } from './tokens';

// The hub reuses its figure for a few seconds; once a minute is plenty for a status bar.
const REFRESH_MS = 60_000;

export class StorageItem extends Widget {
  storage: IStorage | null = null;

  constructor() {
    super();
    this.addClass('jp-gpulab-storage');
    this.node.setAttribute('role', 'status');
    this.node.textContent = 'Home …';
  }

  render(nowSeconds: number = Date.now() / 1000): void {
    const s = this.storage;
    if (!s) {
      return;
    }
    const level = storageLevel(s.percent);
    this.node.textContent = storageText(s);
    this.node.title = storageTitle(s, nowSeconds);
    this.node.dataset.level = level;
    this.toggleClass('jp-gpulab-storage-warn', level === 'warn');
    this.toggleClass('jp-gpulab-storage-critical', level === 'critical');
  }
}

export const storagePlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:storage',
  description: "The home's usage against its quota in the status bar, with notices at 80 and 95 %",
  autoStart: true,
  requires: [IGpulabSession, IStatusBar],
  activate: (_app: JupyterFrontEnd, session: IGpulabSession | null, statusBar: IStatusBar) => {
    if (!session) {
      return;
    }
    const item = new StorageItem();
    item.id = 'gpulab-storage-status';
    statusBar.registerStatusItem('jupyterlab-gpulab:storage', {
      item,
      align: 'left',
      rank: -5
    });
    const notices = new StorageNotices();
    const refresh = async () => {
      let answer: IStorage | { available: false };
      try {
        answer = await getStorage();
      } catch {
        return; // the hub did not answer: keep the last figure
      }
      if ('available' in answer) {
        item.node.textContent = '';
        return;
      }
      item.storage = answer;
      item.render();
      const notice = notices.next(answer);
      if (notice) {
        const notify = notice.level === 'critical' ? Notification.error : Notification.warning;
        notify(notice.text, { autoClose: false });
      }
    };
    void refresh();
    setInterval(() => void refresh(), REFRESH_MS);
  }
};
