// The consumer project's own tasks: a welcome that sends one reminder now and schedules
// another for the next day.
import type { Akadze, Task } from "@akadze/akadze";
import ms from "ms";
import { z } from "zod";

const Recipient = z.object({ email: z.email() });
type Recipient = z.infer<typeof Recipient>;

/** The addresses `reminders.send` has sent to, in order (a stand-in for a mail service). */
export const sent: string[] = [];

/** Register the tasks on `app`; returns the welcome task, which the signup code enqueues. */
export function register(app: Akadze): Task<Recipient, Recipient, void> {
  const reminder = app.task(
    "reminders.send",
    { args: Recipient },
    ({ email }) => {
      sent.push(email);
    },
  );
  return app.task("signups.welcome", { args: Recipient }, async ({ email }) => {
    await reminder.enqueue({ email });
    await reminder.using({ delay: ms("1 day") }).enqueue({ email });
  });
}
