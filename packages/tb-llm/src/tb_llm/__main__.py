import sys

from tb_llm.cli import main

sys.exit(main())
