// The session plugin: reads this server's gpulab status (every other gpulab plugin waits for
// it), provides IGpulabSession, polls status and balance, and raises the low-balance
// notifications.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { getBalance, getCatalog, getStatus, pollServer } from './api';
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
    return session;
  }
};
