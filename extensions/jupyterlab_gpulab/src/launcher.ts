// Show the launcher as soon as the layout is restored.
//
// Stock JupyterLab opens the launcher from the file browser's first `routed` handler, and the
// router emits `routed` only after the workspace route has saved the freshly loaded state
// database through a 750 ms debouncer and a PUT: about a second on every fresh page in which the
// user looks at an empty main area. Measured on the 2-core machine: layout restored at ~1.6 s,
// launcher at ~2.6 s. The file browser's handler still runs later; it finds the main area
// occupied and adds nothing.
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { PageConfig } from '@jupyterlab/coreutils';

import { plainLabUrl } from './logic';

const CREATE_LAUNCHER = 'launcher:create';

export const earlyLauncherPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpulab:early-launcher',
  description: 'Opens the launcher as soon as the layout is restored, not after the first save.',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, labShell: ILabShell | null): void => {
    if (!labShell || !plainLabUrl(PageConfig.getOption('treePath'), window.location.search)) {
      return;
    }
    void labShell.restored.then(() => {
      if (labShell.isEmpty('main') && app.commands.hasCommand(CREATE_LAUNCHER)) {
        void app.commands.execute(CREATE_LAUNCHER);
      }
    });
  }
};
