from torchburn.cli import main

raise SystemExit(main())
