// The status-bar plugin: mode, price (the spot price and bid on spot servers), session cost
// (ticking), balance, the preemption countdown, and the no-GPU toggle button.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IStatusBar } from '@jupyterlab/statusbar';

import { CommandIDs, IGpulabSession, IGpulabSpot } from './tokens';
import { StatusItem } from './widgets';

export const statusBarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:status-bar',
  description: 'gpulab in the status bar: mode, price, cost, balance, countdown, no-GPU toggle',
  autoStart: true,
  requires: [IGpulabSession, IStatusBar],
  optional: [IGpulabSpot],
  activate: (
    app: JupyterFrontEnd,
    session: IGpulabSession | null,
    statusBar: IStatusBar,
    spot: IGpulabSpot | null
  ): void => {
    if (!session) {
      return;
    }
    const item = new StatusItem(() => {
      if (app.commands.hasCommand(CommandIDs.toggle)) {
        void app.commands.execute(CommandIDs.toggle);
      }
    });
    item.id = 'gpulab-status';
    const render = () => {
      item.status = session.status;
      item.balance = session.balance;
      if (spot) {
        item.spot = spot.status;
        item.secondsLeft = spot.secondsLeft;
        item.countdownTitle = spot.countdownTitle;
      }
      item.render();
    };
    statusBar.registerStatusItem('jupyterlab-gpulab:status', {
      item,
      align: 'left',
      rank: -10
    });
    render();
    session.balanceChanged.connect(render);
    spot?.changed.connect(render);
    setInterval(render, 1000); // the session's cost ticks
  }
};
