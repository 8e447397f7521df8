// The session plugin: reads this server's gpulab status (every other gpulab plugin waits for
// it), provides IGpulabSession, polls status and balance, and raises the low-balance
// notifications.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { getBalance, getCatalog, getNotices, getStatus, pollServer } from './api';
import { GpulabSession } from './model';
import { IGpulabSession } from './tokens';

export const sessionPlugin: JupyterFrontEndPlugin<IGpulabSession | null> = {
  id: 'jupyterlab-gpulab:session',
  description: "This server's gpulab session (status, catalog, balance) for the other plugins.",
  autoStart: true,
  provides: IGpulabSession,
  activate: async (app: JupyterFrontEnd): Promise<IGpulabSession | null> => {
    const session = await GpulabSession.create({
      getStatus,
      getBalance,
      getCatalog,
      pollServer,
      reload: () => window.location.reload()
    });
    if (!session) {
      return null;
    }
    session.balanceWarned.connect((_, messages) => {
      for (const message of messages) {
        Notification.warning(message, { autoClose: false });
      }
    });
    session.start();
    void showNotices();
    return session;
  }
};

// The platform's own actions on this user's servers (an idle GPU moved to no-GPU mode), each
// shown once in this browser.
const SEEN_KEY = 'jupyterlab-gpulab:notices-seen';

async function showNotices(): Promise<void> {
  let notices;
  try {
    notices = (await getNotices()).notices;
  } catch {
    return;
  }
  const seen = Number(window.localStorage.getItem(SEEN_KEY) ?? '0');
  const fresh = notices.filter(n => n.t > seen);
  for (const notice of fresh) {
    Notification.info(notice.message, { autoClose: false });
  }
  if (fresh.length) {
    window.localStorage.setItem(SEEN_KEY, String(Math.max(...fresh.map(n => n.t))));
  }
}
