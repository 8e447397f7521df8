// gpulab inside JupyterLab, one plugin per feature. The session plugin reads this server's
// gpulab status and provides IGpulabSession (tokens.ts); the others require it and stay
// inactive when it is null (a server not started by gpulab).
import { JupyterFrontEndPlugin } from '@jupyterlab/application';

import { datasetsPlugin } from './datasets';
import { gpuUsagePlugin } from './gpuitem';
import { jobsPlugin } from './jobspanel';
import { earlyLauncherPlugin } from './launcher';
import { modeSwitchPlugin } from './modeswitch';
import { sessionPlugin } from './session';
import { spotPlugin } from './spotserver';
import { statusBarPlugin } from './statusbar';
import { storagePlugin } from './storageitem';

const plugins: JupyterFrontEndPlugin<any>[] = [
  sessionPlugin,
  statusBarPlugin,
  storagePlugin,
  modeSwitchPlugin,
  datasetsPlugin,
  gpuUsagePlugin,
  spotPlugin,
  jobsPlugin,
  earlyLauncherPlugin
];

export default plugins;
